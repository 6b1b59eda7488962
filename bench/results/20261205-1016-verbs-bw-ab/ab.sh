cd "$(dirname "$0")/../../.."
export RNIC_DEVICES=rxe:127.0.0.1
one() { p=$((19000+RANDOM%900)); LD_LIBRARY_PATH=$1 timeout 60 ib_write_bw -d rnic_127_0_0_1 -s 1048576 -n 2000 -F -p $p > /tmp/bsrv.log 2>&1 & sleep 0.5; RNIC_VERBS_PROGRESS=caller LD_LIBRARY_PATH=$1 timeout 60 ib_write_bw -d rnic_127_0_0_1 -s 1048576 -n 2000 -F -p $p 127.0.0.1 > /tmp/bcli.log 2>&1; wait; grep -A1 'BW average' /tmp/bcli.log | tail -1 | awk '{print $4}'; }
nat() { p=$((19000+RANDOM%900)); timeout 60 target/release/rnicctl perf write-bw -e -d rxe:127.0.0.1 -s 1048576 -n 2000 -p $p > /tmp/nsrv.log 2>&1 & sleep 0.5; timeout 60 target/release/rnicctl perf write-bw -d rxe:127.0.0.1 -s 1048576 -n 2000 -p $p 127.0.0.1 > /tmp/ncli.log 2>&1; wait; awk 'NF==5 && $1 ~ /^[0-9]+$/ && $2 ~ /^[0-9]+$/ {v=$4} END {print v}' /tmp/ncli.log; }
for i in $(seq 1 ${1:-3}); do
 if [ $((i % 2)) = 1 ]; then echo "native-e $(nat) dropin $(one target/release/verbs)"; else echo "dropin $(one target/release/verbs) native-e $(nat)"; fi
done
