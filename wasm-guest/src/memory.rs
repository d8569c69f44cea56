//! QuickJS's allocator: Rust's global allocator, with a note of whether any allocation
//! failed.
//!
//! The host caps the guest's linear memory, so an allocation past the cap fails. QuickJS
//! then throws `InternalError: out of memory`, except when even that error object cannot
//! be allocated: it then throws `null`. The note lets the guest say what happened instead
//! of printing a bare `null`.

use std::sync::atomic::{AtomicBool, Ordering};

use rquickjs::allocator::{Allocator, RustAllocator};

static FAILED: AtomicBool = AtomicBool::new(false);

/// Whether an allocation has failed during this run.
pub fn ran_out() -> bool {
    FAILED.load(Ordering::Relaxed)
}

fn note(ptr: *mut u8, size: usize) -> *mut u8 {
    if ptr.is_null() && size > 0 {
        FAILED.store(true, Ordering::Relaxed);
    }
    ptr
}

/// [`RustAllocator`], watched.
pub struct WatchedAllocator(pub RustAllocator);

// SAFETY: every method forwards to `RustAllocator`, which upholds the trait's contract;
// `note` only reads the returned pointer.
unsafe impl Allocator for WatchedAllocator {
    fn alloc(&mut self, size: usize) -> *mut u8 {
        note(self.0.alloc(size), size)
    }

    fn calloc(&mut self, count: usize, size: usize) -> *mut u8 {
        note(self.0.calloc(count, size), count.saturating_mul(size))
    }

    unsafe fn dealloc(&mut self, ptr: *mut u8) {
        // SAFETY: the caller passes a pointer this allocator (so `RustAllocator`) returned.
        unsafe { self.0.dealloc(ptr) }
    }

    unsafe fn realloc(&mut self, ptr: *mut u8, new_size: usize) -> *mut u8 {
        // SAFETY: as for `dealloc`.
        note(unsafe { self.0.realloc(ptr, new_size) }, new_size)
    }

    unsafe fn usable_size(ptr: *mut u8) -> usize {
        // SAFETY: as for `dealloc`.
        unsafe { RustAllocator::usable_size(ptr) }
    }
}
