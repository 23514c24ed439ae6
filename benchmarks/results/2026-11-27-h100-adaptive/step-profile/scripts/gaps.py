import gzip, json, sys, collections
t=json.load(gzip.open(sys.argv[1])); marker=sys.argv[2]
k=[e for e in t['traceEvents'] if e.get('ph')=='X' and e.get('cat') in ('kernel','gpu_memcpy','gpu_memset')]
k.sort(key=lambda e:e['ts'])
idx=[i for i,e in enumerate(k) if e['name'].startswith(marker)]
print('markers',len(idx))
for a,b in zip(idx,idx[1:]):
    seg=k[a:b]; span=seg[-1]['ts']-seg[0]['ts']
    end=seg[0]['ts']; busy=0; small=0; big=[]
    for e in seg:
        g=e['ts']-end
        if g>0:
            if g<=3: small+=g
            else: big.append((round(g,1),prev[:40],e['name'][:40]))
        busy+=max(0,e['ts']+e['dur']-max(end,e['ts']))
        end=max(end,e['ts']+e['dur']); prev=e['name']
    print(f'step span {span/1e3:.2f} ms kernels {len(seg)} busy {busy/1e3:.2f} small-gaps {small/1e3:.3f} big-gaps {sum(g[0] for g in big)/1e3:.3f}')
    for g in sorted(big,reverse=True)[:12]: print('   ',g)
