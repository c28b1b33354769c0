//! One interpreter started in the jail: new user, PID, mount, network, IPC, UTS and cgroup
//! namespaces, the file-system [`View`], Landlock, seccomp and resource limits, set up by the
//! kernel before the interpreter runs a line.
//!
//! The process tree: this process → a *keeper* (forked by `Command`, single-threaded) → the
//! *jailed* process, cloned by the keeper into the new namespaces (PID 1 there), which the keeper
//! maps to an unprivileged user and then waits for. The jailed process mounts its view, pivots
//! into it, drops to uid 1000, restricts itself with Landlock and seccomp and execs the
//! interpreter. Both die with SIGKILL when their parent dies (`PR_SET_PDEATHSIG`), and everything
//! in the PID namespace dies with its PID 1: killing the keeper's process group kills the whole
//! sandbox, whatever the program started or however it detached itself.
//!
//! A keeper can die before the jailed process asks for that signal, and changing user clears it:
//! the jailed process asks first thing and again as uid 1000, each time then checking the keeper
//! is there (it holds their pipe's only write end until it ends; `getppid` is 0 in a new PID
//! namespace). Before, one killed early left its jailed process waiting for ever.
//!
//! Code that runs between `fork` and `exec` here allocates nothing (the parent has other threads,
//! whose allocator locks a fork may copy held): every path, map and option is prepared in the
//! parent, and errors are written to the output pipe from fixed text.

use super::filter;
use super::raw::{check, fail, keeper_alive_or_exit, proc_path, write_fd, write_file};
use super::view::View;
use anyhow::{Context, Result};
use landlock::{PathBeneath, RulesetCreated, RulesetCreatedAttr};
use nix::fcntl::OFlag;
use nix::mount::{mount, umount2, MntFlags, MsFlags};
use nix::sched::CloneFlags;
use nix::sys::resource::Resource;
use nix::sys::stat::Mode;
use std::ffi::{CStr, CString};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Arc;

/// The uid and gid the program runs as inside its namespace.
const INSIDE_ID: u32 = 1000;
/// The host uid and gid it is mapped to when the caller is root ("nobody").
const NOBODY: u32 = 65534;

/// Resource limits of a jailed process.
#[derive(Debug, Clone)]
pub(crate) struct Limits {
    /// Address space (RLIMIT_AS).
    pub memory_bytes: u64,
    /// Largest file written (RLIMIT_FSIZE).
    pub file_bytes: u64,
    /// CPU seconds (RLIMIT_CPU), if bounded.
    pub cpu_seconds: Option<u64>,
    /// Size of its writable `/tmp` (a tmpfs).
    pub work_bytes: u64,
    /// Threads (RLIMIT_NPROC, counted in its own user namespace; new processes are refused by
    /// seccomp whatever this says).
    pub threads: u64,
}

/// A running jailed interpreter and the parent's ends of its pipes (all non-blocking).
pub(crate) struct Jailed {
    child: std::process::Child,
    /// Its fd 3: what the harness reads.
    pub input: OwnedFd,
    /// Its fd 4: what the harness writes (taken by the reader).
    replies: Option<OwnedFd>,
    /// Its fds 1 and 2 (one pipe, or one each), when kept (taken by the reader).
    output: Vec<OwnedFd>,
    /// The host directory it runs in, in the insecure mode (removed when it ends).
    scratch: Option<std::path::PathBuf>,
}

impl Jailed {
    /// Kill the whole sandbox (the keeper's process group, and with the jailed PID 1 every
    /// process of its namespace) and reap the keeper.
    pub fn kill(&mut self) {
        // SAFETY: killpg only sends a signal; a group that is gone gives ESRCH.
        unsafe {
            libc::killpg(self.child.id() as i32, libc::SIGKILL);
        }
        let _ = self.child.wait();
    }

    /// The read end of its replies.
    pub fn take_replies(&mut self) -> OwnedFd {
        self.replies.take().expect("the replies are taken once")
    }

    /// The read ends of its output (none when it is discarded; two when kept apart).
    pub fn take_output(&mut self) -> Vec<OwnedFd> {
        std::mem::take(&mut self.output)
    }

    /// How the keeper ended (the jailed process's exit code, or 128 + its signal), if it has.
    pub fn try_wait(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }
}

impl Drop for Jailed {
    fn drop(&mut self) {
        self.kill();
        if let Some(dir) = &self.scratch {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// How programs are walled off.
pub(crate) enum Isolation {
    /// By the kernel (this module).
    Kernel(Arc<View>),
    /// Only by resource limits and an empty environment, in a fresh host directory: what a user
    /// asked for with the flag that says it is insecure.
    Insecure,
}

/// A pointer array for `execve`, with the strings it points into.
struct CArgs {
    _strings: Vec<CString>,
    pointers: Vec<*const libc::c_char>,
}

impl CArgs {
    fn new(items: impl IntoIterator<Item = CString>) -> Self {
        let strings: Vec<CString> = items.into_iter().collect();
        let mut pointers: Vec<*const libc::c_char> = strings.iter().map(|s| s.as_ptr()).collect();
        pointers.push(std::ptr::null());
        CArgs {
            _strings: strings,
            pointers,
        }
    }
}

/// What the jailed process does after the clone, all prepared in the parent.
struct Init {
    view: Arc<View>,
    /// The pipe to the keeper, read end then write end (the keeper's, closed here).
    sync: Arc<[AtomicI32; 2]>,
    drop_root: bool,
    root_options: CString,
    work_options: CString,
    rlimits: Vec<(Resource, u64, u64)>,
    ruleset: Option<RulesetCreated>,
    rules: Vec<(CString, landlock::BitFlags<landlock::AccessFs>)>,
    seccomp: &'static [seccompiler::BpfProgram; 2],
    python: CString,
    argv: CArgs,
    envp: CArgs,
    fds: (RawFd, RawFd),
}

/// What the keeper does after the fork.
struct Keeper {
    parent: libc::pid_t,
    sync: Arc<[AtomicI32; 2]>,
    init: Option<Box<dyn FnMut() -> isize>>,
    stack: Vec<u8>,
    setgroups: &'static CStr,
    uid_map: CString,
    gid_map: CString,
}

/// Moves the prepared state into `pre_exec` (which wants `Send + Sync`): it is only used in the
/// forked child, which has a single thread.
struct ChildOnly<T>(T);
// SAFETY: see the type's documentation.
unsafe impl<T> Send for ChildOnly<T> {}
// SAFETY: see the type's documentation.
unsafe impl<T> Sync for ChildOnly<T> {}

impl ChildOnly<Keeper> {
    fn run(&mut self) -> ! {
        self.0.run()
    }
}

impl Keeper {
    /// The keeper: clone the jailed process into new namespaces, map its users, let it go, and
    /// end as it ends.
    fn run(&mut self) -> ! {
        // SAFETY: prctl and getppid take no pointers.
        unsafe {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            if libc::getppid() != self.parent {
                libc::_exit(1);
            }
        }
        let (sync_r, sync_w) = check(nix::unistd::pipe2(OFlag::O_CLOEXEC), "creating a pipe");
        self.sync[0].store(sync_r.as_raw_fd(), Ordering::SeqCst);
        self.sync[1].store(sync_w.as_raw_fd(), Ordering::SeqCst);
        let flags = CloneFlags::CLONE_NEWUSER
            | CloneFlags::CLONE_NEWPID
            | CloneFlags::CLONE_NEWNS
            | CloneFlags::CLONE_NEWNET
            | CloneFlags::CLONE_NEWIPC
            | CloneFlags::CLONE_NEWUTS
            | CloneFlags::CLONE_NEWCGROUP;
        let Some(init) = self.init.take() else {
            fail("the keeper ran twice", 0)
        };
        // SAFETY: the child runs `init` on its own stack in its own copy of this memory.
        let pid = unsafe { nix::sched::clone(init, &mut self.stack, flags, Some(libc::SIGCHLD)) };
        let pid = check(
            pid,
            "creating the namespaces (user, PID, mount, network, IPC, UTS, cgroup)",
        );
        drop(sync_r);
        let mut buf = [0u8; 64];
        write_file(
            proc_path(&mut buf, pid.as_raw(), b"setgroups"),
            self.setgroups.to_bytes(),
            "writing setgroups",
        );
        write_file(
            proc_path(&mut buf, pid.as_raw(), b"uid_map"),
            self.uid_map.to_bytes(),
            "mapping the user",
        );
        write_file(
            proc_path(&mut buf, pid.as_raw(), b"gid_map"),
            self.gid_map.to_bytes(),
            "mapping the group",
        );
        write_fd(sync_w.as_raw_fd(), b"1");
        // The write end stays open while the keeper lives: the jailed process checks it.
        let alive = std::os::fd::IntoRawFd::into_raw_fd(sync_w) as u32;
        // SAFETY: closing descriptors (the pipes' copies, and the one `Command` waits on).
        unsafe {
            if alive > 0 {
                libc::syscall(libc::SYS_close_range, 0u32, alive - 1, 0u32);
            }
            libc::syscall(libc::SYS_close_range, alive + 1, u32::MAX, 0u32);
        }
        loop {
            let mut status = 0;
            // SAFETY: waitpid writes the status into a local.
            let r = unsafe { libc::waitpid(pid.as_raw(), &mut status, libc::__WALL) };
            if r == pid.as_raw() {
                let code = if libc::WIFEXITED(status) {
                    libc::WEXITSTATUS(status)
                } else {
                    128 + libc::WTERMSIG(status)
                };
                // SAFETY: ending the keeper.
                unsafe { libc::_exit(code) }
            }
            if r < 0 && nix::errno::Errno::last() != nix::errno::Errno::EINTR {
                // SAFETY: ending the keeper.
                unsafe { libc::_exit(125) }
            }
        }
    }
}

impl Init {
    /// The jailed process: wait for the keeper's maps, mount the view, pivot into it, then limits,
    /// identity, Landlock, seccomp, descriptors, and the interpreter.
    fn run(&mut self) -> isize {
        let sync = self.sync[0].load(Ordering::SeqCst);
        // SAFETY: prctl takes no pointers; closing this process's copy of the keeper's end.
        unsafe {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            libc::close(self.sync[1].load(Ordering::SeqCst));
        }
        let mut byte = [0u8; 1];
        // SAFETY: read into a local buffer. A keeper gone before writing leaves nothing to read.
        if unsafe { libc::read(sync, byte.as_mut_ptr().cast(), 1) } != 1 {
            fail("waiting for the user map", nix::errno::Errno::last() as i32);
        }
        self.mount_view();
        // SAFETY: sethostname from a static buffer (the UTS namespace is the sandbox's own).
        unsafe {
            libc::sethostname(c"sandbox".as_ptr(), 7);
        }
        for &(resource, soft, hard) in &self.rlimits {
            check(
                nix::sys::resource::setrlimit(resource, soft, hard),
                "setting a resource limit",
            );
        }
        if self.drop_root {
            use nix::unistd::{setgroups, setresgid, setresuid, Gid, Uid};
            check(setgroups(&[]), "dropping supplementary groups");
            let (g, u) = (Gid::from_raw(INSIDE_ID), Uid::from_raw(INSIDE_ID));
            check(setresgid(g, g, g), "changing to the sandbox's group");
            check(setresuid(u, u, u), "changing to the sandbox's user");
        }
        // Changing user cleared the parent-death signal: asked again, then the keeper checked.
        // SAFETY: prctl takes no pointers.
        unsafe {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
        }
        keeper_alive_or_exit(sync);
        // Landlock's ruleset is a descriptor: enforced before the others are closed.
        self.restrict();
        self.place_descriptors();
        // SAFETY: the pointer arrays are NUL-terminated and point into live CStrings.
        unsafe {
            libc::execve(
                self.python.as_ptr(),
                self.argv.pointers.as_ptr(),
                self.envp.pointers.as_ptr(),
            );
        }
        fail("starting the interpreter", nix::errno::Errno::last() as i32)
    }

    fn mount_view(&self) {
        let v = &*self.view;
        let none: Option<&CStr> = None;
        let private = mount(none, c"/", none, MsFlags::MS_REC | MsFlags::MS_PRIVATE, none);
        check(private, "making the mount namespace private");
        let nosuid = MsFlags::MS_NOSUID | MsFlags::MS_NODEV;
        let root = mount(
            Some(c"tmpfs"),
            &*v.mount_point,
            Some(c"tmpfs"),
            nosuid,
            Some(&*self.root_options),
        );
        check(root, "mounting the new root (tmpfs)");
        for d in &v.dirs {
            match nix::unistd::mkdir(&**d, Mode::from_bits_truncate(0o755)) {
                Ok(()) | Err(nix::errno::Errno::EEXIST) => {}
                Err(e) => fail("creating a directory of the new root", e as i32),
            }
        }
        for f in &v.files {
            let flags = OFlag::O_CREAT | OFlag::O_WRONLY | OFlag::O_CLOEXEC;
            drop(check(
                nix::fcntl::open(&**f, flags, Mode::from_bits_truncate(0o644)),
                "creating a bind target",
            ));
        }
        for b in &v.binds {
            let bound = mount(
                Some(&*b.source),
                &*b.target,
                none,
                MsFlags::MS_BIND | MsFlags::MS_REC,
                none,
            );
            check(bound, "binding a directory of the interpreter");
            if let Some(flags) = b.read_only {
                check(mount(none, &*b.target, none, flags, none), "making a bind read-only");
            }
        }
        for (link, to) in &v.links {
            // SAFETY: two NUL-terminated paths.
            if unsafe { libc::symlink(to.as_ptr(), link.as_ptr()) } != 0 {
                fail("linking /bin, /lib", nix::errno::Errno::last() as i32);
            }
        }
        // A kernel that refuses a new /proc (one already partly hidden) leaves the sandbox
        // without one, which is stricter, not weaker.
        let _ = mount(
            Some(c"proc"),
            &*v.proc_dir,
            Some(c"proc"),
            nosuid | MsFlags::MS_NOEXEC,
            none,
        );
        let work = mount(
            Some(c"tmpfs"),
            &*v.work_dir,
            Some(c"tmpfs"),
            nosuid,
            Some(&*self.work_options),
        );
        check(work, "mounting /tmp (tmpfs)");
        check(nix::unistd::chdir(&*v.mount_point), "entering the new root");
        check(nix::unistd::pivot_root(c".", c"."), "pivoting into the new root");
        check(umount2(c".", MntFlags::MNT_DETACH), "detaching the old root");
        check(nix::unistd::chdir(c"/"), "entering the new root");
        let read_only = MsFlags::MS_REMOUNT | MsFlags::MS_BIND | MsFlags::MS_RDONLY | nosuid;
        check(
            mount(none, c"/", none, read_only, none),
            "making the new root read-only",
        );
        check(nix::unistd::chdir(c"/tmp"), "entering /tmp");
    }

    /// The harness's channel at fds 3 (in) and 4 (out); every other descriptor above 2 closed.
    fn place_descriptors(&self) {
        // SAFETY: descriptor operations on numbers this process owns.
        unsafe {
            let a = libc::fcntl(self.fds.0, libc::F_DUPFD_CLOEXEC, 10);
            let b = libc::fcntl(self.fds.1, libc::F_DUPFD_CLOEXEC, 10);
            if a < 0 || b < 0 || libc::dup2(a, 3) != 3 || libc::dup2(b, 4) != 4 {
                fail("placing the harness's channel", nix::errno::Errno::last() as i32);
            }
            libc::syscall(libc::SYS_close_range, 5u32, u32::MAX, 0u32);
        }
    }

    fn restrict(&mut self) {
        let Some(mut ruleset) = self.ruleset.take() else {
            fail("the jail ran twice", 0)
        };
        for (path, access) in &self.rules {
            let flags = OFlag::O_PATH | OFlag::O_CLOEXEC;
            let Ok(fd) = nix::fcntl::open(&**path, flags, Mode::empty()) else {
                continue;
            };
            ruleset = ruleset
                .add_rule(PathBeneath::new(fd, *access))
                .unwrap_or_else(|_| fail("adding a Landlock rule", nix::errno::Errno::last() as i32));
        }
        if ruleset.restrict_self().is_err() {
            fail("enforcing Landlock", nix::errno::Errno::last() as i32);
        }
        for program in self.seccomp {
            if seccompiler::apply_filter(program).is_err() {
                fail("installing the seccomp filter", nix::errno::Errno::last() as i32);
            }
        }
    }
}

/// What becomes of a harness's standard streams.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Streams {
    /// Output and errors to /dev/null (the checker's).
    Discard,
    /// Output and errors through one pipe, in the order written.
    Merged,
    /// Output and errors through a pipe each, and an input on fd 0 (a script's run).
    Apart,
}

/// The pipes between this process and a harness: (the child's end, the parent's end) of each.
pub(crate) struct Pipes {
    pub input: (OwnedFd, OwnedFd),
    pub replies: (OwnedFd, OwnedFd),
    pub output: Vec<(OwnedFd, OwnedFd)>,
    pub stdin: Option<(OwnedFd, OwnedFd)>,
}

/// A pipe as (the child's end, the parent's non-blocking end): the child reads it when
/// `child_reads`, else writes it.
fn pipe(child_reads: bool) -> Result<(OwnedFd, OwnedFd)> {
    let (r, w) = nix::unistd::pipe2(OFlag::O_CLOEXEC)?;
    let ends = if child_reads { (r, w) } else { (w, r) };
    nix::fcntl::fcntl(&ends.1, nix::fcntl::FcntlArg::F_SETFL(OFlag::O_NONBLOCK))?;
    Ok(ends)
}

impl Pipes {
    fn new(streams: Streams) -> Result<Pipes> {
        Ok(Pipes {
            input: pipe(true)?,
            replies: pipe(false)?,
            output: match streams {
                Streams::Discard => Vec::new(),
                Streams::Merged => vec![pipe(false)?],
                Streams::Apart => vec![pipe(false)?, pipe(false)?],
            },
            stdin: if streams == Streams::Apart {
                Some(pipe(true)?)
            } else {
                None
            },
        })
    }
}

fn rlimits(l: &Limits) -> Vec<(Resource, u64, u64)> {
    let mut r = vec![
        (Resource::RLIMIT_AS, l.memory_bytes, l.memory_bytes),
        (Resource::RLIMIT_FSIZE, l.file_bytes, l.file_bytes),
        (Resource::RLIMIT_CORE, 0, 0),
        (Resource::RLIMIT_NOFILE, 256, 256),
        (Resource::RLIMIT_NPROC, l.threads, l.threads),
    ];
    if let Some(cpu) = l.cpu_seconds {
        r.push((Resource::RLIMIT_CPU, cpu, cpu + 1));
    }
    r
}

/// The harness's one argument: which process started it (seen in `ps`; tests look for it).
pub(crate) fn parent_tag() -> String {
    format!("stepwise-parent={}", std::process::id())
}

/// The command line of a harness: the interpreter in isolated mode running `script`.
fn command(python: &Path, script: &str, pipes: &Pipes) -> Result<Command> {
    let mut cmd = Command::new(python);
    cmd.args(["-I", "-S", "-B", "-c", script, &parent_tag()])
        .env_clear()
        .env("LC_ALL", "C.UTF-8")
        .process_group(0);
    let end = |i: usize| -> Result<Stdio> {
        Ok(match pipes.output.get(i).or(pipes.output.first()) {
            Some((child, _)) => Stdio::from(child.try_clone()?),
            None => Stdio::null(),
        })
    };
    cmd.stdout(end(0)?).stderr(end(1)?);
    match &pipes.stdin {
        Some((child, _)) => cmd.stdin(Stdio::from(child.try_clone()?)),
        None => cmd.stdin(Stdio::null()),
    };
    Ok(cmd)
}

/// Start `python` running `script` in the jail, limited by `limits`, its streams as `streams`
/// says (with [`Streams::Apart`], the returned writer feeds its standard input).
pub(crate) fn spawn(
    python: &Path,
    script: &str,
    isolation: &Isolation,
    limits: &Limits,
    streams: Streams,
) -> Result<(Jailed, Option<OwnedFd>)> {
    let pipes = Pipes::new(streams)?;
    let mut cmd = command(python, script, &pipes)?;
    let fds = (pipes.input.0.as_raw_fd(), pipes.replies.0.as_raw_fd());
    let mut scratch = None;
    match isolation {
        Isolation::Kernel(view) => {
            let keeper = keeper(view.clone(), python, script, limits, fds)?;
            let mut keeper = ChildOnly(keeper);
            // SAFETY: the keeper allocates nothing and ends in `_exit` (see the module's notes).
            unsafe {
                cmd.pre_exec(move || keeper.run());
            }
        }
        Isolation::Insecure => scratch = Some(insecure(&mut cmd, limits, fds)?),
    }
    let child = super::spawner::spawn(cmd);
    let child = match child {
        Ok(c) => c,
        Err(e) => {
            if let Some(dir) = &scratch {
                let _ = std::fs::remove_dir_all(dir);
            }
            return Err(e).context("starting the sandbox");
        }
    };
    let Pipes {
        input,
        replies,
        output,
        stdin,
    } = pipes;
    let jailed = Jailed {
        child,
        input: input.1,
        replies: Some(replies.1),
        output: output.into_iter().map(|(_, parent)| parent).collect(),
        scratch,
    };
    Ok((jailed, stdin.map(|(_, parent)| parent)))
}

fn keeper(view: Arc<View>, python: &Path, script: &str, limits: &Limits, fds: (RawFd, RawFd)) -> Result<Keeper> {
    use std::os::unix::ffi::OsStrExt;
    let sync = Arc::new([AtomicI32::new(-1), AtomicI32::new(-1)]);
    let uid = nix::unistd::geteuid().as_raw();
    let gid = nix::unistd::getegid().as_raw();
    let root = uid == 0;
    // Root maps itself (for the set-up only) and the sandbox's user to nobody; anyone else can
    // map only themselves.
    let map = |id: u32| {
        if root {
            format!("0 0 1\n{INSIDE_ID} {NOBODY} 1\n")
        } else {
            format!("{INSIDE_ID} {id} 1\n")
        }
    };
    let tag = parent_tag();
    let argv = [
        python.as_os_str().as_bytes(),
        b"-I",
        b"-S",
        b"-B",
        b"-c",
        script.as_bytes(),
        tag.as_bytes(),
    ]
    .into_iter()
    .map(CString::new)
    .collect::<std::result::Result<Vec<_>, _>>()
    .context("the harness has a NUL byte")?;
    let init = Init {
        rules: view
            .rules
            .iter()
            .map(|r| (r.path.clone(), filter::access(r.kind)))
            .collect(),
        view,
        sync: sync.clone(),
        drop_root: root,
        root_options: CString::new("size=4m,nr_inodes=1024,mode=755")?,
        work_options: CString::new(format!("size={},nr_inodes=4096,mode=1777", limits.work_bytes.max(4096)))?,
        rlimits: rlimits(limits),
        ruleset: Some(filter::ruleset()?),
        seccomp: filter::seccomp()?,
        python: CString::new(python.as_os_str().as_bytes())?,
        argv: CArgs::new(argv),
        envp: CArgs::new([CString::new("LC_ALL=C.UTF-8")?]),
        fds,
    };
    let mut init = ChildOnly(init);
    Ok(Keeper {
        parent: std::process::id() as libc::pid_t,
        sync,
        init: Some(Box::new(move || init.0.run())),
        stack: vec![0u8; 256 << 10],
        setgroups: if root { c"allow" } else { c"deny" },
        uid_map: CString::new(map(uid))?,
        gid_map: CString::new(map(gid))?,
    })
}

/// The insecure mode: limits and the channel's descriptors only.
fn insecure(cmd: &mut Command, limits: &Limits, fds: (RawFd, RawFd)) -> Result<std::path::PathBuf> {
    let limits = rlimits(limits);
    let dir = super::spawner::scratch_dir()?;
    cmd.current_dir(&dir);
    let limits = ChildOnly(limits);
    // SAFETY: only system calls on prepared values.
    unsafe {
        cmd.pre_exec(move || {
            for &(resource, soft, hard) in limits.0.iter().filter(|l| l.0 != Resource::RLIMIT_NPROC) {
                nix::sys::resource::setrlimit(resource, soft, hard)?;
            }
            let a = libc::fcntl(fds.0, libc::F_DUPFD_CLOEXEC, 10);
            let b = libc::fcntl(fds.1, libc::F_DUPFD_CLOEXEC, 10);
            if a < 0 || b < 0 || libc::dup2(a, 3) != 3 || libc::dup2(b, 4) != 4 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    Ok(dir)
}
