//! Process-wide memory settings the harness needs at production shapes.

/// Serves large blocks from the heap and keeps freed memory there for the
/// next allocation.
///
/// The f64 GEMMs of the fused oracle (the `gemm` crate) allocate their
/// packing buffers, above 32 MiB at production shapes, on every call.
/// glibc serves blocks above its mmap threshold (at most 32 MiB unless set)
/// with fresh mappings and trims the heap's top, so every call took its
/// buffers from the kernel again: a page fault per page, and on several
/// threads a TLB flush on each processor. In a V = 151936 gradcheck whose
/// failure is classified (8 oracle sweeps), that was half the time:
/// `gradcheck --fixture fixtures/synthetic-qwen2.5-1.5b --time 2 --impl
/// suites/fixtures/impls/tail_block/kernel.py:drops_tail` took 100.7 s
/// (81 s of it system time) with the threshold at 32 MiB and 58.8 s (14 s)
/// with it at 2 GiB, the same peak (3.66 GB), one run after the other on
/// the 2-core machine. The process's resident memory then stays at its
/// high-water mark, which is what the peak figures already report.
pub fn keep_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets allocator parameters; it is called before
    // any thread of ours starts.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, i32::MAX);
        libc::mallopt(libc::M_TRIM_THRESHOLD, i32::MAX);
    }
}
