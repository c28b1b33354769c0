//! The system calls a jailed program may not make (seccomp, through `seccompiler`) and the
//! Landlock ruleset that bounds what it may do to files, the network and other processes.
//! Both are built in the parent; the jail's child only installs them.

use super::view::RuleKind;
use anyhow::{anyhow, Result};
use landlock::{
    Access, AccessFs, AccessNet, CompatLevel, Compatible, Ruleset, RulesetAttr, RulesetCreated, Scope, ABI,
};
use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter, SeccompRule, TargetArch,
};
use std::collections::BTreeMap;
use std::sync::OnceLock;

/// System calls refused with `EPERM` whatever their arguments: sockets (the network namespace
/// has none to reach anyway), tracing and reading other processes' memory, mounts and namespaces,
/// kernel keyrings, modules, BPF, kexec, performance counters, io_uring, and the few calls that
/// would let a process leave its session or change the machine.
const DENIED: &[libc::c_long] = &[
    libc::SYS_socket,
    libc::SYS_connect,
    libc::SYS_bind,
    libc::SYS_listen,
    libc::SYS_accept,
    libc::SYS_accept4,
    libc::SYS_ptrace,
    libc::SYS_process_vm_readv,
    libc::SYS_process_vm_writev,
    libc::SYS_pidfd_getfd,
    libc::SYS_kcmp,
    libc::SYS_mount,
    libc::SYS_umount2,
    libc::SYS_pivot_root,
    libc::SYS_chroot,
    libc::SYS_open_tree,
    libc::SYS_move_mount,
    libc::SYS_fsopen,
    libc::SYS_fsconfig,
    libc::SYS_fsmount,
    libc::SYS_fspick,
    libc::SYS_mount_setattr,
    libc::SYS_unshare,
    libc::SYS_setns,
    libc::SYS_bpf,
    libc::SYS_keyctl,
    libc::SYS_add_key,
    libc::SYS_request_key,
    libc::SYS_kexec_load,
    libc::SYS_kexec_file_load,
    libc::SYS_init_module,
    libc::SYS_finit_module,
    libc::SYS_delete_module,
    libc::SYS_perf_event_open,
    libc::SYS_userfaultfd,
    libc::SYS_io_uring_setup,
    libc::SYS_io_uring_enter,
    libc::SYS_io_uring_register,
    libc::SYS_acct,
    libc::SYS_swapon,
    libc::SYS_swapoff,
    libc::SYS_reboot,
    libc::SYS_sethostname,
    libc::SYS_setdomainname,
    libc::SYS_quotactl,
    libc::SYS_open_by_handle_at,
    libc::SYS_name_to_handle_at,
    libc::SYS_fanotify_init,
    libc::SYS_syslog,
    libc::SYS_vhangup,
    libc::SYS_setsid,
    libc::SYS_setpgid,
    libc::SYS_execveat,
    libc::SYS_memfd_create,
    #[cfg(target_arch = "x86_64")]
    libc::SYS_fork,
    #[cfg(target_arch = "x86_64")]
    libc::SYS_vfork,
    #[cfg(target_arch = "x86_64")]
    libc::SYS_uselib,
];

fn arch() -> Result<TargetArch> {
    match std::env::consts::ARCH {
        "x86_64" => Ok(TargetArch::x86_64),
        "aarch64" => Ok(TargetArch::aarch64),
        "riscv64" => Ok(TargetArch::riscv64),
        other => Err(anyhow!("the sandbox's seccomp filter is not built for {other}")),
    }
}

fn compile(rules: BTreeMap<i64, Vec<SeccompRule>>, action: SeccompAction) -> Result<BpfProgram> {
    let filter = SeccompFilter::new(rules, SeccompAction::Allow, action, arch()?)
        .map_err(|e| anyhow!("building the seccomp filter: {e}"))?;
    filter
        .try_into()
        .map_err(|e| anyhow!("compiling the seccomp filter: {e}"))
}

/// The two filters: `EPERM` for [`DENIED`], for `clone` without `CLONE_THREAD` (a new process;
/// threads stay allowed) and for `ioctl(TIOCSTI)` (typing into a terminal); `ENOSYS` for
/// `clone3`, whose flags a filter cannot read, so that the C library falls back to `clone`.
fn build() -> Result<[BpfProgram; 2]> {
    let arg = |index: u8, op: SeccompCmpOp, value: u64| {
        SeccompCondition::new(index, SeccompCmpArgLen::Qword, op, value).map_err(|e| anyhow!("{e}"))
    };
    let rule = |conditions| SeccompRule::new(conditions).map_err(|e| anyhow!("{e}"));
    let mut denied: BTreeMap<i64, Vec<SeccompRule>> = DENIED.iter().map(|&s| (s, Vec::new())).collect();
    denied.insert(
        libc::SYS_clone,
        vec![rule(vec![arg(
            0,
            SeccompCmpOp::MaskedEq(libc::CLONE_THREAD as u64),
            0,
        )?])?],
    );
    denied.insert(
        libc::SYS_ioctl,
        vec![
            rule(vec![arg(1, SeccompCmpOp::MaskedEq(0xffff_ffff), libc::TIOCSTI)?])?,
            rule(vec![arg(1, SeccompCmpOp::MaskedEq(0xffff_ffff), libc::TIOCLINUX)?])?,
        ],
    );
    let clone3: BTreeMap<i64, Vec<SeccompRule>> = [(libc::SYS_clone3, Vec::new())].into();
    Ok([
        compile(denied, SeccompAction::Errno(libc::EPERM as u32))?,
        compile(clone3, SeccompAction::Errno(libc::ENOSYS as u32))?,
    ])
}

/// The compiled filters (built once a process).
pub(crate) fn seccomp() -> Result<&'static [BpfProgram; 2]> {
    static FILTERS: OnceLock<Result<[BpfProgram; 2], String>> = OnceLock::new();
    FILTERS
        .get_or_init(|| build().map_err(|e| format!("{e:#}")))
        .as_ref()
        .map_err(|e| anyhow!("{e}"))
}

/// The newest Landlock ABI the ruleset asks for (older kernels get what they have, see
/// [`landlock_available`]).
const ABI_WANTED: ABI = ABI::V6;

/// An empty ruleset handling every file-system and TCP access and scoping signals and abstract
/// Unix sockets to the sandbox: what a rule does not grant is refused. Rules are added in the
/// child, which alone sees the new root.
pub(crate) fn ruleset() -> Result<RulesetCreated> {
    Ruleset::default()
        .handle_access(AccessFs::from_all(ABI_WANTED))
        .and_then(|r| r.handle_access(AccessNet::from_all(ABI_WANTED)))
        .and_then(|r| r.scope(Scope::from_all(ABI_WANTED)))
        .and_then(|r| r.create())
        .map_err(|e| anyhow!("creating the Landlock ruleset: {e}"))
}

/// Whether the kernel enforces Landlock's file-system rules (ABI 1 or later), or why not.
pub(crate) fn landlock_available() -> Result<()> {
    Ruleset::default()
        .set_compatibility(CompatLevel::HardRequirement)
        .handle_access(AccessFs::from_all(ABI::V1))
        .and_then(|r| r.create())
        .map(drop)
        .map_err(|e| anyhow!("{e}"))
}

/// The accesses a rule of `kind` grants.
pub(crate) fn access(kind: RuleKind) -> landlock::BitFlags<AccessFs> {
    let all = AccessFs::from_all(ABI_WANTED);
    match kind {
        RuleKind::ReadOnly => AccessFs::ReadFile | AccessFs::ReadDir,
        RuleKind::Executable => AccessFs::ReadFile | AccessFs::Execute,
        RuleKind::ReadFile => AccessFs::ReadFile.into(),
        RuleKind::Device => AccessFs::ReadFile | AccessFs::WriteFile | AccessFs::Truncate,
        RuleKind::Work => {
            all & !(AccessFs::Execute
                | AccessFs::MakeChar
                | AccessFs::MakeBlock
                | AccessFs::MakeFifo
                | AccessFs::MakeSock
                | AccessFs::IoctlDev)
        }
    }
}
