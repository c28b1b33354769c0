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

/// What the program printed, one buffer a stream (its output and errors, or both merged): the
/// first `limit` bytes of each kept, the rest read and dropped.
pub(crate) struct Output {
    streams: Vec<Stream>,
    limit: usize,
}

struct Stream {
    fd: Option<OwnedFd>,
    kept: Vec<u8>,
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
    pub fn new(fds: Vec<OwnedFd>, limit: usize) -> Self {
        Output {
            streams: fds
                .into_iter()
                .map(|fd| Stream {
                    fd: Some(fd),
                    kept: Vec::new(),
                })
                .collect(),
            limit,
        }
    }

    /// What stream `i` kept.
    pub fn kept(&self, i: usize) -> &[u8] {
        self.streams.get(i).map(|s| s.kept.as_slice()).unwrap_or_default()
    }

    /// Read what is available, keeping what fits.
    fn drain(&mut self) {
        let mut chunk = [0u8; 64 << 10];
        for stream in &mut self.streams {
            while let Some(fd) = &stream.fd {
                match read_some(fd, &mut chunk) {
                    Ok(0) => stream.fd = None,
                    Ok(n) => {
                        let room = self.limit.saturating_sub(stream.kept.len());
                        stream.kept.extend_from_slice(&chunk[..n.min(room)]);
                    }
                    Err(Errno::EAGAIN) => break,
                    Err(_) => stream.fd = None,
                }
            }
        }
    }

    fn open(&self) -> impl Iterator<Item = &OwnedFd> {
        self.streams.iter().filter_map(|s| s.fd.as_ref())
    }

    /// Drain until the writers are gone or `deadline` passes.
    pub fn finish(&mut self, deadline: Instant) {
        while self.open().next().is_some() {
            let Some(wait) = remaining(deadline) else { return };
            let mut fds: Vec<PollFd> = self
                .open()
                .map(|fd| PollFd::new(fd.as_fd(), PollFlags::POLLIN))
                .collect();
            if poll(&mut fds, wait).is_err() {
                return;
            }
            drop(fds);
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
        fds.extend(output.open().map(|fd| PollFd::new(fd.as_fd(), PollFlags::POLLIN)));
        if let Some((fd, _)) = to {
            fds.push(PollFd::new(fd.as_fd(), PollFlags::POLLOUT));
        }
        let polled = poll(&mut fds, wait);
        drop(fds);
        match polled {
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
