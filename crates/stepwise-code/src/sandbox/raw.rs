//! What the sandbox's forked processes (the keeper, the jailed process) call between `fork` and
//! `exec`: system calls and fixed buffers, no allocation (the parent has other threads, whose
//! allocator locks a fork may copy held).

use nix::fcntl::OFlag;
use nix::sys::stat::Mode;
use std::ffi::CStr;
use std::os::fd::RawFd;

/// Ends this process when the keeper, the only writer of the pipe `sync` reads, has ended.
pub(super) fn keeper_alive_or_exit(sync: RawFd) {
    let (events, revents) = (libc::POLLIN, 0);
    let mut poll = libc::pollfd {
        fd: sync,
        events,
        revents,
    };
    // SAFETY: poll on one local descriptor record, without waiting; _exit ends the process.
    unsafe {
        if libc::poll(&mut poll, 1, 0) < 0 || poll.revents & (libc::POLLHUP | libc::POLLERR) != 0 {
            libc::_exit(1);
        }
    }
}

pub(super) fn write_fd(fd: RawFd, bytes: &[u8]) {
    // SAFETY: write from a valid buffer; errors are ignored (this reports failures).
    unsafe {
        libc::write(fd, bytes.as_ptr().cast(), bytes.len());
    }
}

/// `n` in decimal, into `buf`, returning the digits.
fn digits(mut n: u64, buf: &mut [u8; 20]) -> &[u8] {
    let mut at = buf.len();
    loop {
        at -= 1;
        buf[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            return &buf[at..];
        }
    }
}

/// Report a failed set-up step on the output pipe and end the process: allocation-free.
pub(super) fn fail(step: &str, errno: i32) -> ! {
    let mut buf = [0u8; 20];
    write_fd(2, b"stepwise-sandbox: ");
    write_fd(2, step.as_bytes());
    write_fd(2, b" (errno ");
    write_fd(2, digits(errno.unsigned_abs() as u64, &mut buf));
    write_fd(2, b")\n");
    // SAFETY: ending the process without running anything of the parent's.
    unsafe { libc::_exit(121) }
}

pub(super) fn check<T>(r: nix::Result<T>, step: &str) -> T {
    r.unwrap_or_else(|e| fail(step, e as i32))
}

/// `/proc/<pid>/<name>` as a C string in `buf`.
pub(super) fn proc_path<'a>(buf: &'a mut [u8; 64], pid: i32, name: &[u8]) -> &'a CStr {
    let mut d = [0u8; 20];
    let pid = digits(pid as u64, &mut d);
    let mut at = 0;
    for part in [&b"/proc/"[..], pid, b"/", name, b"\0"] {
        buf[at..at + part.len()].copy_from_slice(part);
        at += part.len();
    }
    CStr::from_bytes_with_nul(&buf[..at]).unwrap_or(c"/")
}

pub(super) fn write_file(path: &CStr, data: &[u8], step: &str) {
    let fd = check(
        nix::fcntl::open(path, OFlag::O_WRONLY | OFlag::O_CLOEXEC, Mode::empty()),
        step,
    );
    if check(nix::unistd::write(&fd, data), step) != data.len() {
        fail(step, libc::EIO);
    }
}
