module sandbox-controller/bench/loadgen

go 1.22
