//! Records of running clusters, so that a run killed before its destructors
//! ran (SIGKILL, or SIGTERM, whose default action skips them) leaves nothing
//! behind for long.
//!
//! Every cluster writes a record into a folder of this user's under the
//! temporary directory (`redlock-sync-records-<uid>`): who owns it (pid and
//! start time), its folder, its server binary, and, appended as they start,
//! its servers (pid and start time). Dropping the cluster removes the
//! record. Every [`Cluster::start`](super::Cluster::start) first reaps the
//! records whose owner is gone: it kills (SIGKILL, by pid) each recorded
//! server that is still that cluster's server, removes the cluster's folder,
//! then the record.
//!
//! "Still that cluster's server" means all of: the pid runs with the
//! recorded start time (a pid reused since is another process), its working
//! folder is the cluster's folder (servers run there, and each cluster's
//! folder has a random name), and it runs the recorded binary. Nothing is
//! ever killed by name. An owner counts as gone when no running process has
//! its pid and start time, so a record is never reaped while its owner lives,
//! even if the owner's pid is reused later.
//!
//! This needs Linux's `/proc`; elsewhere no record is kept and nothing is
//! reaped.

use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::{io_error, process, HarnessError};

/// How long reaping waits for one killed server to exit.
const EXIT_WAIT: Duration = Duration::from_secs(2);
/// The records folder's name, before the user id.
const RECORDS_PREFIX: &str = "redlock-sync-records-";

/// A running process, named for good: its pid and its start time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Pid {
    pid: u32,
    since: u64,
}

impl Pid {
    fn of(pid: u32) -> Option<Pid> {
        process::running_since(pid).map(|since| Pid { pid, since })
    }

    fn is_running(self) -> bool {
        process::running_since(self.pid) == Some(self.since)
    }

    fn line(self, tag: &str) -> String {
        format!("{tag} {} {}\n", self.pid, self.since)
    }
}

/// The record of one live cluster; dropping it removes the record, so drop
/// it after the cluster's servers are dead and its folder is gone.
#[derive(Debug)]
pub(super) struct Record {
    path: PathBuf,
}

impl Record {
    /// Writes the record of the cluster in `dir`, whose servers run
    /// `binary`, owned by this process. `None` where records cannot be kept
    /// or checked (no `/proc`, or a path that is not UTF-8).
    ///
    /// # Errors
    ///
    /// [`HarnessError::Io`] if the records folder cannot be made or written,
    /// or is not this user's.
    pub(super) fn create(dir: &Path, binary: &Path) -> Result<Option<Record>, HarnessError> {
        match records_folder() {
            Some(folder) => Self::create_in(&folder, dir, binary),
            None => Ok(None),
        }
    }

    fn create_in(folder: &Path, dir: &Path, binary: &Path) -> Result<Option<Record>, HarnessError> {
        let Some(owner) = Pid::of(std::process::id()) else {
            return Ok(None);
        };
        let dir = fs::canonicalize(dir)
            .map_err(|e| io_error(format!("resolving {}", dir.display()), e))?;
        let binary = fs::canonicalize(binary)
            .map_err(|e| io_error(format!("resolving {}", binary.display()), e))?;
        let (Some(name), Some(dir_text), Some(binary_text)) = (
            dir.file_name().and_then(|name| name.to_str()),
            dir.to_str().filter(|text| !text.contains('\n')),
            binary.to_str().filter(|text| !text.contains('\n')),
        ) else {
            return Ok(None);
        };
        make_records_folder(folder)?;
        let path = folder.join(name);
        // One write, so a reader sees the whole head or (owner just killed)
        // an empty file, which reaping removes once the owner is gone.
        let head = format!(
            "{}dir {dir_text}\nbinary {binary_text}\n",
            owner.line("owner")
        );
        fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .and_then(|mut file| file.write_all(head.as_bytes()))
            .map_err(|e| io_error(format!("writing the cluster record {}", path.display()), e))?;
        Ok(Some(Record { path }))
    }

    /// The record's file, for [`add_server`].
    pub(super) fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for Record {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.path);
    }
}

/// Adds a server the cluster just started to its record (before anything
/// else can fail, so that no server of a killed run goes unrecorded).
///
/// # Errors
///
/// [`HarnessError::Io`] if the record cannot be written; the caller kills
/// the server then.
pub(super) fn add_server(record: &Path, pid: u32) -> Result<(), HarnessError> {
    // A server that exited already (bad arguments) needs no reaping.
    let Some(server) = Pid::of(pid) else {
        return Ok(());
    };
    fs::OpenOptions::new()
        .append(true)
        .open(record)
        .and_then(|mut file| file.write_all(server.line("server").as_bytes()))
        .map_err(|e| {
            io_error(
                format!("recording server pid {pid} in {}", record.display()),
                e,
            )
        })
}

/// Reaps every record whose owner is gone (see the module docs). Best
/// effort: what cannot be read or removed now is left for a later run.
pub(super) fn reap_orphans() {
    if let Some(folder) = records_folder().filter(|folder| is_ours(folder)) {
        reap_orphans_in(&folder);
    }
}

/// Reaps every record of this process's own clusters, as if it were gone:
/// for the time bound, just before the process exits.
pub(super) fn reap_own() {
    if let Some(folder) = records_folder().filter(|folder| is_ours(folder)) {
        reap_in(&folder, Pid::of(std::process::id()));
    }
}

fn reap_orphans_in(folder: &Path) {
    reap_in(folder, None);
}

/// Reaps the records in `folder` whose owner is gone, and those of
/// `also` (a live owner).
fn reap_in(folder: &Path, also: Option<Pid>) {
    let Ok(entries) = fs::read_dir(folder) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let Ok(bytes) = fs::read(&path) else {
            continue;
        };
        match Orphan::parse(&String::from_utf8_lossy(&bytes)) {
            Some(orphan) if orphan.owner.is_running() && Some(orphan.owner) != also => {}
            Some(orphan) => orphan.reap(&path),
            // Empty or cut short: its owner was killed while writing the
            // head, before any server started. The folder name carries the
            // owner's pid ("redlock-sync-<pid>-..."); no start time, so only
            // a pid that runs no process at all counts as gone.
            None => {
                if owner_pid_in_name(&path).is_some_and(process::is_gone) {
                    let _ = fs::remove_file(&path);
                }
            }
        }
    }
}

fn owner_pid_in_name(record: &Path) -> Option<u32> {
    let name = record.file_name()?.to_str()?;
    name.strip_prefix("redlock-sync-")?
        .split('-')
        .next()?
        .parse()
        .ok()
}

/// A record read back.
#[derive(Debug, PartialEq, Eq)]
struct Orphan {
    owner: Pid,
    dir: PathBuf,
    binary: PathBuf,
    servers: Vec<Pid>,
}

impl Orphan {
    /// `None` unless the head (owner, dir, binary) is complete. A server
    /// line cut short by a kill is skipped: that server had not started.
    fn parse(text: &str) -> Option<Orphan> {
        let mut owner = None;
        let mut dir = None;
        let mut binary = None;
        let mut servers = Vec::new();
        for line in text.split_terminator('\n') {
            let Some((tag, value)) = line.split_once(' ') else {
                continue;
            };
            match tag {
                "owner" => owner = parse_pid(value),
                "dir" => dir = Some(PathBuf::from(value)),
                "binary" => binary = Some(PathBuf::from(value)),
                "server" => servers.extend(parse_pid(value)),
                _ => {}
            }
        }
        Some(Orphan {
            owner: owner?,
            dir: dir?,
            binary: binary?,
            servers,
        })
    }

    /// Kills the servers that are still this cluster's, removes its folder,
    /// then the record (last, so that a reaper killed halfway leaves the
    /// record to the next one).
    fn reap(&self, record: &Path) {
        for &server in &self.servers {
            if self.is_still_ours(server) && process::send_signal("KILL", server.pid).is_ok() {
                process::wait_gone(server.pid, EXIT_WAIT);
            }
        }
        // A record names only a folder of its own name: a damaged record
        // cannot send the reaper into another folder.
        if self.dir.file_name() == record.file_name() {
            let _ = fs::remove_dir_all(&self.dir);
        }
        let _ = fs::remove_file(record);
    }

    fn is_still_ours(&self, server: Pid) -> bool {
        server.is_running()
            && process::cwd(server.pid).as_deref() == Some(self.dir.as_path())
            && process::exe(server.pid).as_deref() == Some(self.binary.as_path())
    }
}

fn parse_pid(value: &str) -> Option<Pid> {
    let (pid, since) = value.split_once(' ')?;
    Some(Pid {
        pid: pid.parse().ok()?,
        since: since.parse().ok()?,
    })
}

/// This process's user id: the owner of its `/proc/self`.
fn my_uid() -> Option<u32> {
    fs::metadata("/proc/self").ok().map(|meta| meta.uid())
}

/// `temp_dir()/redlock-sync-records-<uid>`, or `None` without `/proc`.
fn records_folder() -> Option<PathBuf> {
    let uid = my_uid()?;
    let temp = std::path::absolute(std::env::temp_dir()).ok()?;
    Some(temp.join(format!("{RECORDS_PREFIX}{uid}")))
}

/// Whether `folder` is a real folder (not a link) of this user's, so that
/// nobody else can plant records in it.
fn is_ours(folder: &Path) -> bool {
    let Some(uid) = my_uid() else {
        return false;
    };
    fs::symlink_metadata(folder)
        .is_ok_and(|meta| meta.is_dir() && meta.uid() == uid && meta.mode() & 0o022 == 0)
}

fn make_records_folder(folder: &Path) -> Result<(), HarnessError> {
    match fs::DirBuilder::new().mode(0o700).create(folder) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(io_error(format!("creating {}", folder.display()), e)),
    }
    if is_ours(folder) {
        Ok(())
    } else {
        Err(io_error(
            format!("using the cluster records folder {}", folder.display()),
            io::Error::new(
                io::ErrorKind::PermissionDenied,
                "it is not a folder that only this user may write: remove it",
            ),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::super::Cluster;
    use super::*;
    use std::process::{Child, Command, Stdio};
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::thread;
    use std::time::Instant;

    /// Set for the child process of the killed-owner test: where it reports
    /// its cluster.
    const CHILD_REPORT: &str = "REDLOCK_SYNC_TEST_KILLED_OWNER_REPORT";
    const CHILD_TEST: &str = "record::tests::child_owner_starts_a_cluster_and_waits_to_be_killed";

    /// A folder of the test's own under the temporary directory, named like
    /// a cluster's folder (records name their folder by its name).
    fn scratch_dir(what: &str) -> PathBuf {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let dir = std::env::temp_dir().join(format!(
            "redlock-sync-{}-{what}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir(&dir).unwrap();
        fs::canonicalize(dir).unwrap()
    }

    /// A stand-in server: `sleep` working in `dir`.
    fn sleeper_in(dir: &Path) -> Child {
        Command::new("sleep")
            .arg("60")
            .current_dir(dir)
            .stdin(Stdio::null())
            .spawn()
            .expect("running `sleep 60`")
    }

    fn sleep_binary(sleeper: &Child) -> PathBuf {
        process::exe(sleeper.id()).expect("/proc/<pid>/exe of a child")
    }

    /// Rewrites the record's owner as this pid with another start time: the
    /// owner is gone, and its pid now belongs to someone else (this test).
    fn owner_gone(record: &Path) {
        let text = fs::read_to_string(record).unwrap();
        let me = Pid::of(std::process::id()).unwrap();
        let reused = Pid {
            since: me.since + 1,
            ..me
        };
        fs::write(
            record,
            text.replace(&me.line("owner"), &reused.line("owner")),
        )
        .unwrap();
    }

    fn is_running(child: &mut Child) -> bool {
        child.try_wait().unwrap().is_none()
    }

    #[test]
    fn an_orphans_server_is_killed_only_while_it_still_is_that_clusters_server() {
        let records = scratch_dir("records");
        let dir = scratch_dir("cluster");
        let elsewhere = scratch_dir("elsewhere");
        let mut server = sleeper_in(&dir);
        let binary = sleep_binary(&server);
        // Same binary, same start time, other folder: someone else's.
        let mut stranger = sleeper_in(&elsewhere);

        let record = Record::create_in(&records, &dir, &binary).unwrap().unwrap();
        add_server(record.path(), server.id()).unwrap();
        add_server(record.path(), stranger.id()).unwrap();
        assert_eq!(record.path(), records.join(dir.file_name().unwrap()));

        // The owner (this process) lives: nothing is touched.
        reap_orphans_in(&records);
        assert!(record.path().exists());
        assert!(dir.exists());
        assert!(is_running(&mut server));

        owner_gone(record.path());
        reap_orphans_in(&records);
        assert!(!record.path().exists());
        assert!(!dir.exists());
        server.wait().unwrap();
        assert!(
            is_running(&mut stranger),
            "a process of another folder was killed"
        );

        stranger.kill().unwrap();
        stranger.wait().unwrap();
        fs::remove_dir_all(&elsewhere).unwrap();
        fs::remove_dir_all(&records).unwrap();
    }

    #[test]
    fn a_recorded_pid_now_running_another_binary_or_since_another_time_is_left_alive() {
        let records = scratch_dir("records");
        let dir = scratch_dir("cluster");
        let mut other_binary = sleeper_in(&dir);
        let mut reused_pid = sleeper_in(&dir);

        let record = Record::create_in(&records, &dir, Path::new("/bin/sh"))
            .unwrap()
            .unwrap();
        add_server(record.path(), other_binary.id()).unwrap();
        let since = process::running_since(reused_pid.id()).unwrap();
        let mut file = fs::OpenOptions::new()
            .append(true)
            .open(record.path())
            .unwrap();
        let earlier = Pid {
            pid: reused_pid.id(),
            since: since - 1,
        };
        file.write_all(earlier.line("server").as_bytes()).unwrap();
        owner_gone(record.path());

        reap_orphans_in(&records);
        assert!(!record.path().exists());
        assert!(is_running(&mut other_binary));
        assert!(is_running(&mut reused_pid));
        for mut child in [other_binary, reused_pid] {
            child.kill().unwrap();
            child.wait().unwrap();
        }
        let _ = fs::remove_dir_all(&dir);
        fs::remove_dir_all(&records).unwrap();
    }

    #[test]
    fn a_record_names_no_folder_but_its_own() {
        let records = scratch_dir("records");
        let dir = scratch_dir("cluster");
        let bystander = scratch_dir("bystander");
        let record = Record::create_in(&records, &dir, Path::new("/bin/sh"))
            .unwrap()
            .unwrap();
        let text = fs::read_to_string(record.path()).unwrap();
        let dir_line = format!("dir {}\n", dir.display());
        let forged = format!("dir {}\n", bystander.display());
        fs::write(record.path(), text.replace(&dir_line, &forged)).unwrap();
        owner_gone(record.path());

        reap_orphans_in(&records);
        assert!(!record.path().exists());
        assert!(
            bystander.exists(),
            "a folder the record did not own was removed"
        );
        for folder in [dir, bystander, records] {
            fs::remove_dir_all(folder).unwrap();
        }
    }

    #[test]
    fn a_record_cut_short_keeps_its_complete_lines() {
        let head = "owner 10 20\ndir /tmp/redlock-sync-1-2-ab\nbinary /usr/bin/redis-server\n";
        let orphan = Orphan::parse(&format!("{head}server 11 21\nserver 12")).unwrap();
        assert_eq!(
            orphan,
            Orphan {
                owner: Pid { pid: 10, since: 20 },
                dir: PathBuf::from("/tmp/redlock-sync-1-2-ab"),
                binary: PathBuf::from("/usr/bin/redis-server"),
                servers: vec![Pid { pid: 11, since: 21 }],
            }
        );
        assert_eq!(Orphan::parse(""), None);
        assert_eq!(Orphan::parse("owner 10 20\ndir /tmp/x\nbin"), None);
        assert_eq!(
            owner_pid_in_name(Path::new("/tmp/r/redlock-sync-4242-7-0a1b2c3d")),
            Some(4242)
        );
        assert_eq!(owner_pid_in_name(Path::new("/tmp/r/other")), None);
    }

    #[test]
    fn an_empty_record_is_removed_once_the_pid_in_its_name_is_gone() {
        let records = scratch_dir("records");
        let mut exited = Command::new("true").spawn().unwrap();
        let gone = exited.id();
        exited.wait().unwrap();
        let ours = records.join(format!("redlock-sync-{}-0-00", std::process::id()));
        let theirs = records.join(format!("redlock-sync-{gone}-0-00"));
        fs::write(&ours, "").unwrap();
        fs::write(&theirs, "owner 1").unwrap();

        reap_orphans_in(&records);
        assert!(ours.exists(), "the record of a live pid, being written");
        assert!(!theirs.exists());
        fs::remove_dir_all(&records).unwrap();
    }

    /// Not a test by itself: the child process of
    /// `servers_and_folder_of_a_killed_owner_are_reaped_by_the_next_start`,
    /// which runs it with `CHILD_REPORT` set and then kills it.
    #[test]
    #[ignore = "the child process of servers_and_folder_of_a_killed_owner_are_reaped_by_the_next_start"]
    fn child_owner_starts_a_cluster_and_waits_to_be_killed() {
        let Some(report) = std::env::var_os(CHILD_REPORT).map(PathBuf::from) else {
            return;
        };
        let cluster = Cluster::start(2).unwrap();
        let mut text = format!("{}\n", cluster.dir().display());
        for node in cluster.nodes() {
            text.push_str(&format!("{}\n", node.pid().unwrap()));
        }
        let partial = report.with_extension("partial");
        fs::write(&partial, text).unwrap();
        fs::rename(&partial, &report).unwrap();
        loop {
            thread::park();
        }
    }

    #[test]
    fn servers_and_folder_of_a_killed_owner_are_reaped_by_the_next_start() {
        let scratch = scratch_dir("killed-owner");
        let report = scratch.join("report");
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([CHILD_TEST, "--exact", "--ignored", "--test-threads=1"])
            .env(CHILD_REPORT, &report)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        while !report.exists() {
            if child.try_wait().unwrap().is_some() || Instant::now() >= deadline {
                let _ = child.kill();
                let output = child.wait_with_output().unwrap();
                panic!(
                    "the child reported no cluster: {}\n{}",
                    String::from_utf8_lossy(&output.stdout),
                    String::from_utf8_lossy(&output.stderr)
                );
            }
            thread::sleep(Duration::from_millis(10));
        }
        let text = fs::read_to_string(&report).unwrap();
        let mut lines = text.lines();
        let dir = PathBuf::from(lines.next().unwrap());
        let servers: Vec<u32> = lines.map(|line| line.parse().unwrap()).collect();
        assert_eq!(servers.len(), 2);
        for &pid in &servers {
            assert!(!process::is_gone(pid), "server {pid} is not running");
        }
        let record = records_folder().unwrap().join(dir.file_name().unwrap());
        assert!(record.exists(), "{} is missing", record.display());

        // SIGKILL: no destructor runs, the servers outlive their owner.
        child.kill().unwrap();
        child.wait().unwrap();

        let fresh = Cluster::start(1).unwrap();
        for &pid in &servers {
            assert!(
                process::is_gone(pid),
                "server {pid} of the killed run still runs"
            );
        }
        assert!(!dir.exists(), "{} is still there", dir.display());
        assert!(!record.exists(), "{} is still there", record.display());
        // The new cluster's own record is kept while it lives.
        let own = records_folder()
            .unwrap()
            .join(fresh.dir().file_name().unwrap());
        assert!(own.exists());
        drop(fresh);
        assert!(!own.exists());
        fs::remove_dir_all(&scratch).unwrap();
    }
}
