"""Speed comparisons: a plain-PyTorch reference of `train_nmt.py --benchmark`'s workload and the table
of every backend and precision against it (results/speed/README.md)."""
