//! The process group of a `command` run, as its task's checkpoint records it: enough to end
//! the group after the server that started it was killed (`kill -9`, a crash), and never
//! another process that later got the same number.
//!
//! A group is recorded when its program starts, before ferry reads a byte of its output
//! ([`RecordedGroup::of`]); the next run of the task, or a cancel while no run holds it, ends
//! it first ([`RecordedGroup::end`]). Linux `/proc` (proc(5)) says who a process is:
//! field 22 of `/proc/PID/stat`, the start time in clock ticks since boot, with the boot's
//! id (`/proc/sys/kernel/random/boot_id`) and the pid namespace (`/proc/self/ns/pid`) —
//! a pid reused after a reboot, in another container or by a later process matches none of
//! the three together.

use serde::{Deserialize, Serialize};

/// Who led a program's process group (module docs): its pid (the group's id), when it
/// started and on which boot and pid namespace.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct RecordedGroup {
    /// The program's pid, which is its group's id (it was started with `process_group(0)`).
    pub pgid: i32,
    /// Field 22 of `/proc/PID/stat` (`starttime`): clock ticks after boot.
    pub started: u64,
    /// `/proc/sys/kernel/random/boot_id`.
    pub boot: String,
    /// `/proc/self/ns/pid`'s link, e.g. `pid:[4026531836]`.
    pub pid_ns: String,
}

/// What [`RecordedGroup::end`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Ended {
    /// The group was still there and was sent SIGKILL.
    Killed,
    /// Nothing of the group is left (or it never ran on this machine and namespace, or the
    /// pid now names another process): nothing was signalled.
    NothingLeft,
    /// Recorded on another machine, boot or pid namespace: not this process's to end.
    Elsewhere,
}

impl RecordedGroup {
    /// The record of a program just started as `pid`; `None` when `/proc` cannot say (not
    /// Linux, `/proc` not mounted): then nothing is recorded and a crash leaves it to the
    /// operator, as before.
    pub fn of(pid: u32) -> Option<RecordedGroup> {
        let pgid = i32::try_from(pid).ok()?;
        Some(RecordedGroup { pgid, started: start_time(pgid)?, boot: boot_id()?, pid_ns: pid_namespace()? })
    }

    /// End what is left of this group. Its leader, when still alive, must be the process
    /// recorded (same start time); when the leader is gone, the group's id cannot have been
    /// given to another process while members of the group live (Linux keeps a pid in use while a
    /// group is named by it), so only processes still in the group that started no earlier than
    /// the leader, and carry this task's `FERRY_TASK_ID`, are killed — a group formed later
    /// around a reused pid has none of this task's processes.
    pub fn end(&self, task_id: &str) -> Ended {
        if boot_id().as_deref() != Some(self.boot.as_str()) || pid_namespace().as_deref() != Some(self.pid_ns.as_str()) {
            return Ended::Elsewhere;
        }
        match start_time(self.pgid) {
            Some(t) if t == self.started => {
                // ESRCH: the group ended meanwhile.
                let _ = nix::sys::signal::killpg(nix::unistd::Pid::from_raw(self.pgid), nix::sys::signal::Signal::SIGKILL);
                Ended::Killed
            }
            // The pid is another process's now: its group is not this task's.
            Some(_) => Ended::NothingLeft,
            None => {
                let mut killed = false;
                for pid in members(self.pgid) {
                    let ours = start_time(pid).is_some_and(|t| t >= self.started) && carries_task(pid, task_id);
                    if ours && nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL).is_ok() {
                        killed = true;
                    }
                }
                if killed {
                    Ended::Killed
                } else {
                    Ended::NothingLeft
                }
            }
        }
    }
}

/// The fields of `/proc/PID/stat` after the command name (which may hold spaces and
/// parentheses: it ends at the last `)`), so `fields[0]` is field 3 (`state`).
fn stat_fields(pid: i32) -> Option<Vec<String>> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &text[text.rfind(')')? + 1..];
    Some(rest.split_whitespace().map(str::to_string).collect())
}

/// Field 22 (`starttime`) of `/proc/PID/stat`; `None` when no such process lives (a zombie
/// counts as gone: it runs nothing).
fn start_time(pid: i32) -> Option<u64> {
    let f = stat_fields(pid)?;
    if f.first().is_some_and(|s| s == "Z" || s == "X") {
        return None;
    }
    f.get(22 - 3)?.parse().ok()
}

/// The pids of the live processes whose group (field 5, `pgrp`) is `pgid`.
fn members(pgid: i32) -> Vec<i32> {
    let Ok(dir) = std::fs::read_dir("/proc") else { return Vec::new() };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| stat_fields(*pid).is_some_and(|f| f.get(5 - 3).and_then(|g| g.parse::<i32>().ok()) == Some(pgid) && f[0] != "Z"))
        .collect()
}

/// Whether process `pid`'s environment holds `FERRY_TASK_ID=task_id` (every program of a
/// task is started with it, and what it starts inherits it).
fn carries_task(pid: i32, task_id: &str) -> bool {
    let want = format!("FERRY_TASK_ID={task_id}");
    std::fs::read(format!("/proc/{pid}/environ")).is_ok_and(|env| env.split(|b| *b == 0).any(|v| v == want.as_bytes()))
}

fn boot_id() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok().map(|s| s.trim().to_string())
}

fn pid_namespace() -> Option<String> {
    std::fs::read_link("/proc/self/ns/pid").ok().map(|p| p.to_string_lossy().into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::CommandExt;

    /// A process of this task's is found by its record and ended; a record whose start time
    /// differs (a reused pid) or names another boot ends nothing.
    #[test]
    fn a_group_is_ended_only_when_it_is_the_one_recorded() {
        let mut child = std::process::Command::new("sleep").arg("600").env("FERRY_TASK_ID", "t-group").process_group(0).spawn().unwrap();
        let rec = RecordedGroup::of(child.id()).expect("/proc answers");
        let reused = RecordedGroup { started: rec.started + 1, ..rec.clone() };
        assert_eq!(reused.end("t-group"), Ended::NothingLeft);
        let other_boot = RecordedGroup { boot: "another".into(), ..rec.clone() };
        assert_eq!(other_boot.end("t-group"), Ended::Elsewhere);
        assert!(child.try_wait().unwrap().is_none(), "neither record ended it");
        assert_eq!(rec.end("t-group"), Ended::Killed);
        assert!(!child.wait().unwrap().success());
    }
}
