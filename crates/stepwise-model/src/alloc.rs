//! [`CacheAligned`]: a global allocator that starts every block of 4 KiB or more on a cache line.
//!
//! The CPU kernels read weights and activations as rows of 64 bytes (an AMX tile's row, an
//! AVX-512 register); Rust asks the allocator only for its values' alignment (two bytes for
//! bf16), and glibc then starts a big buffer 16 or 32 bytes into a line, so that every row a
//! tile loads spans two lines. On a 2-vCPU Xeon with AMX one tile block over L1-resident rows
//! ran at 0.85–0.95 TFLOP/s on such buffers and 1.9–2.2 on aligned ones, and scoring a 0.5B PRM
//! with the system allocator at 906–927 tokens/s against 1,441–1,447 with this one (the same
//! scores): what the Python extension, which had the system allocator, ran at. The command
//! line's mimalloc trained as fast with it as without (its large blocks were aligned already);
//! now every build's are.
//! Small blocks keep the inner allocator's alignment (lines would waste their memory).

use std::alloc::{GlobalAlloc, Layout};

/// Bytes from which a block starts on a cache line.
const LARGE: usize = 4096;
/// A cache line.
const LINE: usize = 64;

/// `A` with every block of `LARGE` (4 KiB) bytes or more aligned to a cache line (see the module).
pub struct CacheAligned<A>(pub A);

/// `layout`, aligned to a cache line when it is large.
fn aligned(layout: Layout) -> Layout {
    match layout.size() >= LARGE && layout.align() < LINE {
        // A power of two at least `layout.align()`, and the size is unchanged: always valid.
        true => Layout::from_size_align(layout.size(), LINE).unwrap_or(layout),
        false => layout,
    }
}

// SAFETY: every block is allocated, grown and freed by `A` with the same (adjusted) layout, at
// least as aligned as asked; `realloc` moves a block by hand where its adjusted alignment changes.
unsafe impl<A: GlobalAlloc> GlobalAlloc for CacheAligned<A> {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as `GlobalAlloc::alloc`'s caller guarantees (a non-zero size, kept by `aligned`).
        unsafe { self.0.alloc(aligned(layout)) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as for `alloc`.
        unsafe { self.0.alloc_zeroed(aligned(layout)) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from this allocator with `layout`, so from `A` with `aligned(layout)`.
        unsafe { self.0.dealloc(ptr, aligned(layout)) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let (old, new) = (
            aligned(layout),
            Layout::from_size_align(new_size, layout.align()).map(aligned),
        );
        let Ok(new) = new else { return std::ptr::null_mut() };
        if old.align() == new.align() {
            // SAFETY: `ptr` is `A`'s block of layout `old`; `A` keeps its alignment when it grows.
            return unsafe { self.0.realloc(ptr, old, new_size) };
        }
        // SAFETY: `new` has a non-zero size (the caller's `new_size`); the copy stays within both
        // blocks; `ptr` is `A`'s block of layout `old`, freed once.
        unsafe {
            let moved = self.0.alloc(new);
            if !moved.is_null() {
                std::ptr::copy_nonoverlapping(ptr, moved, layout.size().min(new_size));
                self.0.dealloc(ptr, old);
            }
            moved
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::alloc::System;

    /// Large blocks start on a line, grown into it or out of it; small ones are the inner
    /// allocator's; a grown block keeps its values.
    #[test]
    fn large_blocks_start_on_a_line() {
        let a = CacheAligned(System);
        // SAFETY: every block below is freed once with the layout it has then.
        unsafe {
            for size in [4096, 10_000, 1 << 20] {
                let layout = Layout::from_size_align(size, 2).unwrap();
                let p = a.alloc(layout);
                assert!(
                    !p.is_null() && (p as usize).is_multiple_of(LINE),
                    "{size} bytes at {p:?}"
                );
                a.dealloc(p, layout);
            }
            let small = Layout::from_size_align(100, 2).unwrap();
            let p = a.alloc(small);
            (0..100).for_each(|i| *p.add(i) = i as u8);
            let grown = a.realloc(p, small, 50_000);
            assert!((grown as usize).is_multiple_of(LINE));
            assert!((0..100).all(|i| *grown.add(i) == i as u8), "values kept");
            let big = Layout::from_size_align(50_000, 2).unwrap();
            let more = a.realloc(grown, big, 90_000);
            assert!((more as usize).is_multiple_of(LINE) && (0..100).all(|i| *more.add(i) == i as u8));
            let shrunk = a.realloc(more, Layout::from_size_align(90_000, 2).unwrap(), 100);
            assert!((0..100).all(|i| *shrunk.add(i) == i as u8));
            a.dealloc(shrunk, small);
        }
    }
}
