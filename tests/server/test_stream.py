"""RequestStream: Events the engine posted while the stream was not read come out as one (a slow
reader sends fewer, larger chunks), in order, with the last one's end."""

from __future__ import annotations

import asyncio

from specdec.server.stream import Event, EventBox, RequestStream


class NoAbort:
    def abort(self, rid, events=None):
        raise AssertionError("nothing is aborted here")


def stream_of(*events: Event) -> RequestStream:
    box = EventBox()
    for e in events:
        box.put(e)
    return RequestStream(NoAbort(), "r", 0, box, prompt_ids=[7, 8])


def test_waiting_events_come_out_as_one():
    async def run():
        s = stream_of(Event([1], cached_tokens=2, logprobs=[-0.1], top_logprobs=[[(1, -0.1)]]),
                      Event([2, 3], cached_tokens=2, logprobs=[-0.2, -0.3], top_logprobs=[[(2, -0.2)], [(3, -0.3)]]),
                      Event([4], finished=True, meta_info={"finish_reason": "length"}, cached_tokens=2,
                            logprobs=[-0.4], top_logprobs=[[(4, -0.4)]]))
        return await s.next_event(), s.finished

    event, finished = asyncio.run(run())
    assert event.token_ids == [1, 2, 3, 4] and event.finished and finished
    assert event.meta_info == {"finish_reason": "length"} and event.cached_tokens == 2
    assert event.logprobs == [-0.1, -0.2, -0.3, -0.4]
    assert event.top_logprobs == [[(1, -0.1)], [(2, -0.2)], [(3, -0.3)], [(4, -0.4)]]


def test_a_finished_event_ends_the_merge_and_an_error_keeps_the_tokens_before_it():
    async def run():
        s = stream_of(Event([1]), Event([], finished=True, error="client disconnected", status=499))
        return await s.next_event()

    event = asyncio.run(run())
    assert event.token_ids == [1] and event.error == "client disconnected" and event.status == 499
    assert event.logprobs is None


def test_an_event_alone_is_itself_and_a_later_one_waits_for_the_next_read():
    async def run():
        s = stream_of(Event([5]))
        first = await s.next_event()
        s._events.put(Event([6], finished=True, meta_info={}))
        return first, await s.next_event()

    first, second = asyncio.run(run())
    assert first.token_ids == [5] and not first.finished
    assert second.token_ids == [6] and second.finished


def test_a_waiting_reader_wakes_for_the_next_event():
    async def run():
        s = stream_of()
        loop = asyncio.get_running_loop()
        loop.call_later(0.01, s._events.put, Event([1]))
        loop.call_later(0.02, s._events.put, Event([2], finished=True, meta_info={}))
        return await s.next_event(), await s.next_event()

    first, second = asyncio.run(run())
    assert first.token_ids == [1] and not first.finished
    assert second.token_ids == [2] and second.finished


def test_events_after_a_finished_one_wait_for_the_next_read():
    """A stream's end comes out alone with the tokens before it (a client leaving after it adds an error)."""
    async def run():
        s = stream_of(Event([1]), Event([2], finished=True, meta_info={}), Event([], finished=True, error="x"))
        return await s.next_event(), await s.next_event()

    end, after = asyncio.run(run())
    assert end.token_ids == [1, 2] and end.meta_info == {} and end.error is None
    assert after.token_ids == [] and after.error == "x"


def test_an_event_pickles_to_itself():
    """The engine's process sends Events to the server's by pickle (``Event.__reduce__``: every field)."""
    import dataclasses
    import pickle

    full = Event([1, 2], finished=True, meta_info={"finish_reason": "stop"}, error="e", status=500,
                 logprobs=[-0.1, -0.2], top_logprobs=[[(1, -0.1)], [(2, -0.2)]], cached_tokens=3)
    for event in (Event([7]), full):
        assert pickle.loads(pickle.dumps(event)) == event
    # __reduce__ passes the fields by position: a field added or moved must be added or moved there
    assert [f.name for f in dataclasses.fields(Event)] == ["token_ids", "finished", "meta_info", "error", "status",
                                                           "logprobs", "top_logprobs", "cached_tokens"]
