"""What ``specdec bench`` and ``specdec bench-serving`` run.

    throughput.py  the main job: the same prompts with and without speculation, in one process
    synthetic.py   full-size random-weight targets, simulated acceptance, the batch-size sweep (GPU)
    synthetic_settings.py  its settings and the target shapes (``write_dummy_checkpoint``); other
                   architectures' config.json for the runs beside vLLM (``write_dummy_config``)
    synthetic_report.py  the sweep's speedups, floor shares, issue-format rows, plot and printed report
    serving.py     the online benchmark of a running server (and a baseline): speedup, report, JSON
    serving_client.py  its streamed requests (sglang's /generate or openai's /v1/completions): TTFT /
                   TPOT / ITL, acceptance, the workload's summary
    report.py      progress bar, acceptance histogram (text and PNG), the commit measured
    step_log.py    engine steps by kind (prefill, or the decode step's choice) and their wall time
"""
