# Environment for long engine runs on a small shared machine (source it before the commands in
# docs/results.md section 7). Without it, every chunk's large arrays are fresh mmap()ed pages and
# ~40% of a step goes to page faults in the kernel; torch's and OpenBLAS's extra threads only
# spin against other processes on 2 cores.
export MALLOC_MMAP_THRESHOLD_=33554432   # keep chunk-sized arrays on the heap (reused, no faults)
export MALLOC_TRIM_THRESHOLD_=4294967296 # and do not hand the heap back after each chunk
export MALLOC_TOP_PAD_=268435456
export OMP_WAIT_POLICY=PASSIVE
export OPENBLAS_NUM_THREADS=1
