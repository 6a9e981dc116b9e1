#!/bin/sh
# A/B on one core: old (b6eb38e) vs new library+daemon (Release), and the raw ping-pong.
# usage: sh build-rt/ab.sh ROUNDS   (LD_LIBRARY_PATH must reach libprotobuf-c/libuv)
R=${1:-5}; here=$(cd "$(dirname "$0")" && pwd); t=$(mktemp -d)
run() { # $1 daemon $2 loop
  rm -f $t/s.sock
  taskset -c 0 $1 --socket $t/s.sock --log-level error & dp=$!
  while [ ! -S $t/s.sock ]; do sleep 0.05; done
  TENSORBROKER_SOCKET=$t/s.sock $2 ${N:-20000} | awk '{print $4}'
  kill $dp; wait $dp 2>/dev/null
}
for i in $(seq $R); do
  o=$(run $here/old/tensorbrokerd $here/old/tbloop-old)
  n=$(run $here/new/tensorbrokerd $here/new/tbloop)
  r=$($here/pp 0 | awk '{print $4}')
  echo "old $o new $n raw $r"
done
