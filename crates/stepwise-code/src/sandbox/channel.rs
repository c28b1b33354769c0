//! Talking to a harness over non-blocking pipes with a deadline: write a message, read the next
//! line, and meanwhile keep draining what the program prints, so that neither side can block the
//! other or this process past the run's time, and nothing read grows past its bound.

use nix::errno::Errno;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use std::os::fd::{AsFd, OwnedFd};
use std::time::Instant;

/// Lines from a harness, at most `limit` bytes each.
pub(crate) struct Reader {
    fd: OwnedFd,
    buf: Vec<u8>,
    limit: usize,
}

/// What the program printed: the first `limit` bytes kept, the rest counted.
pub(crate) struct Output {
    fd: Option<OwnedFd>,
    pub kept: Vec<u8>,
    limit: usize,
}

/// How waiting for a line ended.
#[derive(Debug)]
pub(crate) enum Event {
    /// A line (without its newline).
    Line(Vec<u8>),
    /// The harness closed its end (it ended).
    Closed,
    /// The deadline passed.
    TimedOut,
    /// A line longer than the bound.
    TooLong,
}

/// Read what is there without blocking: `Ok(0)` at the end, `Err(EAGAIN)` when nothing is.
fn read_some(fd: &OwnedFd, into: &mut [u8]) -> nix::Result<usize> {
    loop {
        match nix::unistd::read(fd, into) {
            Err(Errno::EINTR) => continue,
            r => return r,
        }
    }
}

impl Reader {
    pub fn new(fd: OwnedFd, limit: usize) -> Self {
        Reader {
            fd,
            buf: Vec::new(),
            limit,
        }
    }

    fn take_line(&mut self) -> Option<Vec<u8>> {
        let at = self.buf.iter().position(|&b| b == b'\n')?;
        let rest = self.buf.split_off(at + 1);
        let mut line = std::mem::replace(&mut self.buf, rest);
        line.pop();
        Some(line)
    }

    /// Read what is available; `Some(event)` when it ends the wait.
    fn fill(&mut self) -> Option<Event> {
        let mut chunk = [0u8; 64 << 10];
        loop {
            match read_some(&self.fd, &mut chunk) {
                Ok(0) => return Some(Event::Closed),
                Ok(n) => {
                    self.buf.extend_from_slice(&chunk[..n]);
                    if self.buf.contains(&b'\n') {
                        return None;
                    }
                    if self.buf.len() > self.limit {
                        return Some(Event::TooLong);
                    }
                }
                Err(Errno::EAGAIN) => return None,
                Err(_) => return Some(Event::Closed),
            }
        }
    }
}

impl Output {
    pub fn new(fd: Option<OwnedFd>, limit: usize) -> Self {
        Output {
            fd,
            kept: Vec::new(),
            limit,
        }
    }

    /// Read what is available, keeping what fits.
    fn drain(&mut self) {
        let Some(fd) = &self.fd else { return };
        let mut chunk = [0u8; 64 << 10];
        loop {
            match read_some(fd, &mut chunk) {
                Ok(0) => {
                    self.fd = None;
                    return;
                }
                Ok(n) => {
                    let room = self.limit.saturating_sub(self.kept.len());
                    self.kept.extend_from_slice(&chunk[..n.min(room)]);
                }
                Err(Errno::EAGAIN) => return,
                Err(_) => {
                    self.fd = None;
                    return;
                }
            }
        }
    }

    /// Drain until the writers are gone or `deadline` passes.
    pub fn finish(&mut self, deadline: Instant) {
        while let Some(fd) = &self.fd {
            let Some(wait) = remaining(deadline) else { return };
            let mut fds = [PollFd::new(fd.as_fd(), PollFlags::POLLIN)];
            if poll(&mut fds, wait).is_err() {
                return;
            }
            self.drain();
        }
    }
}

/// Milliseconds until `deadline` as a poll timeout, or `None` once it has passed.
fn remaining(deadline: Instant) -> Option<PollTimeout> {
    let left = deadline.checked_duration_since(Instant::now())?;
    let ms = left.as_millis().clamp(1, i32::MAX as u128) as i32;
    PollTimeout::try_from(ms).ok()
}

/// Write `message` to `to` (when given) and wait for the next line from `from`, draining
/// `output` all the while, until `deadline`. A reader that closes before the message is written
/// ends the wait as [`Event::Closed`].
pub(crate) fn exchange(
    mut to: Option<(&OwnedFd, &[u8])>,
    from: &mut Reader,
    output: &mut Output,
    deadline: Instant,
) -> Event {
    loop {
        if let Some(line) = from.take_line() {
            return Event::Line(line);
        }
        if let Some((fd, bytes)) = to {
            match nix::unistd::write(fd, bytes) {
                Ok(n) if n == bytes.len() => to = None,
                Ok(n) => to = Some((fd, &bytes[n..])),
                Err(Errno::EAGAIN) | Err(Errno::EINTR) => {}
                Err(_) => return Event::Closed,
            }
        }
        let Some(wait) = remaining(deadline) else {
            return Event::TimedOut;
        };
        let mut fds = vec![PollFd::new(from.fd.as_fd(), PollFlags::POLLIN)];
        if let Some(fd) = &output.fd {
            fds.push(PollFd::new(fd.as_fd(), PollFlags::POLLIN));
        }
        if let Some((fd, _)) = to {
            fds.push(PollFd::new(fd.as_fd(), PollFlags::POLLOUT));
        }
        match poll(&mut fds, wait) {
            Ok(_) | Err(Errno::EINTR) => {}
            Err(_) => return Event::Closed,
        }
        output.drain();
        if let Some(end) = from.fill() {
            if let Some(line) = from.take_line() {
                return Event::Line(line);
            }
            return end;
        }
    }
}
