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
  # ab.sh runs A first in odd repetitions and B first in even ones. If the
  # second run of a pair reads a factor f higher (f < 1: lower) than it
  # would first, B/A reads r*f in odd pairs and r/f in even ones: their
  # geometric mean is r with the order effect taken out, their ratio f^2.
  odd=[d['B'][r]/d['A'][r] for r in reps if r%2==1]
  even=[d['B'][r]/d['A'][r] for r in reps if r%2==0]
  if odd and even:
    mo,me=s.median(odd),s.median(even)
    print('  order-corrected B/A %.3f (A first: %.3f over %d, B first: %.3f over %d; second-run factor %.3f)'
          %((mo*me)**0.5,mo,len(odd),me,len(even),(mo/me)**0.5))
