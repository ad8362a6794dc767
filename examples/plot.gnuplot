# Compare training runs over wall time from the workers' --log-csv files
# (header time_s,epoch,iter,loss,samples_per_s,comm_wait_pct).
#
#   gnuplot -e "outdir='out'; modes='sync async'" examples/plot.gnuplot
#
# reads OUTDIR/MODE-worker0.csv for each MODE and writes OUTDIR/loss.png and
# OUTDIR/throughput.png, one line per mode.  examples/multi_gpu_one_host.sh
# runs it after training.

if (!exists("outdir")) outdir = "out"
if (!exists("modes")) modes = "sync async"

if (strstrt(GPVAL_TERMINALS, "pngcairo") > 0) {
    set terminal pngcairo size 960,600 noenhanced font ",11"
} else {
    set terminal png size 960,600 noenhanced
}
set datafile separator ","
set key top right box opaque
set grid
set xlabel "wall time since the worker started (s)"

csv(m) = sprintf("%s/%s-worker0.csv", outdir, m)

# the header line of each CSV names the columns; skip it
set output outdir."/loss.png"
set title "training loss of worker 0 (lower is better)"
set ylabel "loss"
plot for [m in modes] csv(m) using 1:4 skip 1 with linespoints pt 7 ps 0.5 lw 2 title m

set output outdir."/throughput.png"
set title "training throughput of worker 0 (higher is better)"
set ylabel "samples/s"
set yrange [0:*]
plot for [m in modes] csv(m) using 1:5 skip 1 with linespoints pt 7 ps 0.5 lw 2 title m

unset output
