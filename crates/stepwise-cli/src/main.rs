//! `stepwise`: process supervision for reasoning models, one subcommand per stage of the loop
//! (the command line itself is the library, [`stepwise_cli::main_with`]).

use stepwise_model::alloc::CacheAligned;

/// mimalloc keeps freed large blocks for reuse; glibc returns them to the system, and a big
/// model's forward pass then page-faults every activation back in. Large blocks start on a
/// cache line, where the CPU kernels' 64-byte rows load fastest ([`CacheAligned`]).
#[global_allocator]
static ALLOC: CacheAligned<mimalloc::MiMalloc> = CacheAligned(mimalloc::MiMalloc);

/// `mi_option_purge_delay` in mimalloc.h (v2 and v3): how long freed memory waits before it is
/// returned to the system, `-1` for never.
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// Keep freed memory for reuse instead of returning it to the system after 10 ms (mimalloc's
/// default). Training and sampling free and reallocate the same buffers thousands of times a
/// second, and each return made the next allocation page-fault its memory back in: millions of
/// faults and a fifth of the lab's CPU time in the kernel (README, "The built-in lab"). Resident
/// memory stays at its high-water mark, which is the peak anyway.
fn keep_freed_memory() {
    // SAFETY: sets one of mimalloc's options, which it reads atomically at its next purge.
    unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, -1) }
}

fn main() {
    keep_freed_memory();
    std::process::exit(stepwise_cli::main_with(std::env::args_os()));
}
