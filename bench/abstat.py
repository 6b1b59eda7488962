#!/usr/bin/env python3
# abstat.py -- medians, best cases and paired B/A ratios of a bench/ab.sh CSV.
# Usage: python3 bench/abstat.py <csv>   (a third build C, if the CSV has one,
# is reported against A too)
import csv,math,statistics as s,sys
rows=[r for r in csv.DictReader(open(sys.argv[1])) if r.get('value') and not r['value'].startswith('ERR')]
for t in ['write-lat-8B-us','write-bw-1MiB']:
  d={}
  builds=[b for b in 'ABC' if any(r['build']==b for r in rows)]
  for b in builds:
    v={int(r['rep']):float(r['value']) for r in rows if r['build']==b and r['test']==t}
    d[b]=v
    vv=list(v.values())
    print(t,b,len(vv),'median %.2f'%s.median(vv),'best %.2f'%(min(vv) if 'lat' in t else max(vv)))
  if 'C' in builds:
    # ab.sh rotates A B C, B C A, C A B: over whole rotations each build
    # runs first, second and third equally often, so the geometric mean of
    # the per-repetition ratios has the order effect averaged out.
    for x,y in [('B','A'),('C','A'),('C','B')]:
      reps=sorted(set(d[x])&set(d[y]))
      reps=reps[:len(reps)//3*3]
      ratios=[d[x][r]/d[y][r] for r in reps]
      wins=sum(1 for r in reps if (d[x][r]<d[y][r]) == ('lat' in t))
      gm=math.exp(sum(math.log(q) for q in ratios)/len(ratios))
      print('  %s/%s: median %.3f, geometric mean %.3f over %d whole rotations; %s better in %d/%d'
            %(x,y,s.median(ratios),gm,len(reps)//3,x,wins,len(reps)))
    continue
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
