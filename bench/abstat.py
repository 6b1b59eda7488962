#!/usr/bin/env python3
# abstat.py -- medians, best cases and paired B/A ratios of a bench/ab.sh CSV.
# Usage: python3 bench/abstat.py <csv>
import csv,statistics as s,sys
rows=[r for r in csv.DictReader(open(sys.argv[1])) if r.get('value') and not r['value'].startswith('ERR')]
for t in ['write-lat-8B-us','write-bw-1MiB']:
  d={}
  for b in 'AB':
    v={int(r['rep']):float(r['value']) for r in rows if r['build']==b and r['test']==t}
    d[b]=v
    vv=list(v.values())
    print(t,b,len(vv),'median %.2f'%s.median(vv),'best %.2f'%(min(vv) if 'lat' in t else max(vv)))
  reps=sorted(set(d['A'])&set(d['B']))
  wins=sum(1 for r in reps if (d['B'][r]<d['A'][r]) == ('lat' in t))
  ratios=[d['B'][r]/d['A'][r] for r in reps]
  print('  B better in %d/%d pairs; median ratio B/A %.3f'%(wins,len(reps),s.median(ratios)))
