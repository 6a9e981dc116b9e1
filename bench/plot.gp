# SPDX-License-Identifier: Apache-2.0
# Latency CDFs of tb-bench scenarios 1 and 4 from its JSON.
#   gnuplot bench/plot.gp         redraws docs/bench-latency.png from bench/latest.json
#   gnuplot -e "json='build/bench.json'; out='build/bench-latency.png'" bench/plot.gp
# (run from the repository root; needs python3 for bench/json2cdf.py)
if (!exists("json")) json = "bench/latest.json"
if (!exists("out")) out = "docs/bench-latency.png"
if (!exists("helper")) helper = "bench/json2cdf.py"

set terminal pngcairo size 2100,600 noenhanced font ",10"
# more than the 8 default line types: the GPU panel has up to 15 rows
set linetype 9 lc rgb "#8b4513" dt 2 lw 2
set linetype 10 lc rgb "#ff1493" dt 2 lw 2
set linetype 11 lc rgb "#2f4f4f" dt 2 lw 2
set linetype 12 lc rgb "#9acd32" dt 2 lw 2
set linetype 13 lc rgb "#4169e1" dt 3 lw 2
set linetype 14 lc rgb "#ff8c00" dt 3 lw 2
set linetype 15 lc rgb "#20b2aa" dt 3 lw 2
set linetype 16 lc rgb "#b22222" dt 3 lw 2
set output out
set multiplot layout 1,3 title "tensorbroker latency distributions (".json.")"
set logscale x
set xlabel "latency (us, log scale)"
set ylabel "fraction of operations <= x"
set yrange [0:1]
set grid
set key bottom right

cmd(sec) = sprintf("python3 %s %s %s", helper, json, sec)
n1 = int(system(cmd("1")." count"))
set title "1: control-plane round trip, host memory"
if (n1 > 0) {
  plot for [i=0:n1-1] "< ".cmd("1") index i using 1:2 with lines lw 2 title columnheader(1)
} else {
  set label 1 "no data" at graph 0.4, graph 0.5
  plot 2 notitle
  unset label 1
}
# scenario 4 in two panels: the hand-offs, then the cold acquires and opens
# (the cold rows of the default settings; those without and with busy
# polling are in the JSON and the table)
warm = "'!cold|open|Open|connect'"
cold = "'cold|open|Open&!polling&!no_prefetch'"
n4 = int(system(cmd("4")." count ".warm))
set title "4: GPU hand-off"
if (n4 > 0) {
  plot for [i=0:n4-1] "< ".cmd("4")." ".warm index i using 1:2 with lines lw 2 title columnheader(1)
} else {
  set label 2 "pending GPU run" at graph 0.35, graph 0.5
  set xrange [1:1000]
  plot -1 notitle
  unset label 2
}
n4c = int(system(cmd("4")." count ".cold))
set title "4: cold acquires (64 MiB) and IPC opens"
if (n4c > 0) {
  set xrange [*:*]
  plot for [i=0:n4c-1] "< ".cmd("4")." ".cold index i using 1:2 with lines lw 2 title columnheader(1)
} else {
  set label 3 "pending GPU run" at graph 0.35, graph 0.5
  set xrange [1:1000]
  plot -1 notitle
}
unset multiplot
