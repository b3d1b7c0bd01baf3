//! The command line: subcommands, options, and the man-page-like help of
//! each (what it does, its exit codes, an example).

use std::ffi::OsString;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use redlock_sync::Kind;

/// One exit-code line of a help text. The codes are padded to five
/// characters so the texts line up; each text stays short, as help is
/// wrapped at the terminal's width. Each help lists a code once, and the
/// codes in ascending order (tests/scripts.rs checks it).
macro_rules! code_line {
    ($code:literal, $($what:expr),+) => {
        concat!("  ", $code, "  ", $($what),+, "\n")
    };
}

/// The usage code's line, with what else it means for this subcommand.
macro_rules! usage_code {
    ($($more:expr),*) => {
        code_line!("64   ", "usage: a bad option, duration, node URL, token or resource; no nodes" $(, $more)*)
    };
}

/// The line of the code for too few nodes.
macro_rules! nodes_code {
    () => {
        code_line!("69   ", "too few nodes answered in time to decide (the message says which\n         failed and how)")
    };
}

/// The system code's line, with what else it means for this subcommand.
macro_rules! system_code {
    ($($more:expr),*) => {
        code_line!("71   ", "system error: no thread, no random numbers, no signal handling" $(, $more)*)
    };
}

/// The text that says which kind flags `extend` and `release` need.
macro_rules! kind_note {
    () => {
        "Give the kind flag the lock was taken with (--shared, or --semaphore K with the same K): \
without one, it is looked for as an exclusive lock. A lock held as another kind is refused, and nothing \
changes on the nodes.\n\n"
    };
}

/// The text that says where the nodes come from, for every subcommand.
macro_rules! nodes_note {
    () => {
        "Nodes come from --nodes or REDLOCK_NODES: comma-separated URLs of independent Redis or Valkey masters \
(redis://[user:password@]host:port[/db] or redis+unix:///path/to/socket[?db=N], and valkey:// or \
valkey+unix:// alike; over TLS rediss:// or valkeys://, with the tool's `tls` feature); three or five for \
fault tolerance. Passwords are never printed."
    };
}

/// The help headings of the options. Each option names its own. A struct's
/// `next_help_heading` would carry over to everything declared after the
/// struct is flattened. The positional arguments would then leave clap's
/// "Arguments" heading, and its order.
const NODES: &str = "Nodes";
const TAKING: &str = "Taking the lock";
const RUNNING: &str = "Running the command";
const KIND: &str = "Kind of lock";

#[derive(Debug, Parser)]
#[command(
    name = "redlock",
    version,
    about = "Run a command under a distributed lock held on a quorum of Redis or Valkey nodes (Redlock)",
    long_about = concat!(
        "Run a command under a distributed lock held on a quorum of independent Redis or Valkey masters \
(the Redlock algorithm): flock(1) across hosts. `redlock run` takes the lock, runs the command, keeps the \
lock alive while the command runs and releases it when the command ends. `acquire`, `extend` and `release` \
take and give back a lock in separate steps, with an explicit token; `status` shows who holds a lock.\n\n",
        "A lock is exclusive by default (--fenced adds a fencing token). --shared takes the read side of a \
read-write lock: readers share it, an exclusive holder excludes them. --semaphore K takes one of K permits. \
Each holder is labelled with --owner, which `status` shows. Its default is HOST:PID, with the pid of \
the process that holds the lock: `redlock run` itself, or the shell that called `redlock acquire`.\n\n",
        nodes_note!()
    ),
    after_help = "Run `redlock help SUBCOMMAND` or `redlock SUBCOMMAND --help` for what each does, its exit codes and an example.",
    after_long_help = concat!(
        "Exit codes (each subcommand's --help has its own list):\n",
        code_line!("0    ", "done (for run: the command's own status)"),
        usage_code!(";\n         or the lock is held as another kind than the one given (--shared,\n         --semaphore K)"),
        nodes_code!(),
        system_code!(),
        code_line!("74   ", "acquire: the token could not be printed (the lock was released)"),
        code_line!("75   ", "the lock is held by another client (--conflict-exit-code changes it)"),
        code_line!("76   ", "the lock was lost while held, or was not held at extend or release"),
        code_line!("77   ", "run, acquire: too many nodes refuse this client (password, ACL, TLS,\n         unknown host)"),
        code_line!("126  ", "run: the command could not be run"),
        code_line!("127  ", "run: the command was not found"),
        code_line!("128+N", "run: the command died of signal N; or signal N stopped the wait"),
        "\nExample:\n",
        "  export REDLOCK_NODES=redis://h1:6379,redis://h2:6379,redis://h3:6379\n",
        "  redlock run --no-wait nightly-report -- /usr/local/bin/nightly-report\n",
        "  redlock run --shared --wait 1m catalog -- ./read-catalog\n",
        "\nThe manual page: `redlock man | man -l -`; shell completions: `redlock completions bash`.\n",
    )
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    Run(RunArgs),
    Acquire(AcquireArgs),
    Extend(ExtendArgs),
    Release(ReleaseArgs),
    Status(StatusArgs),
    Man(ManArgs),
    Completions(CompletionsArgs),
    #[command(hide = true)]
    Supervise(SuperviseArgs),
}

impl Command {
    /// Whether `--json` was given.
    pub fn json(&self) -> bool {
        let nodes = match self {
            Command::Run(a) => &a.nodes,
            Command::Acquire(a) => &a.nodes,
            Command::Extend(a) => &a.nodes,
            Command::Release(a) => &a.nodes,
            Command::Status(a) => &a.nodes,
            Command::Man(_) | Command::Completions(_) | Command::Supervise(_) => return false,
        };
        nodes.json
    }
}

/// Where the nodes are and how long to wait for them: every subcommand's.
#[derive(Debug, Args)]
pub struct NodeArgs {
    // Not clap's `env`: clap's usage line would show `--nodes` as given
    // whenever the variable is set (see [`NodeArgs::urls`]).
    #[arg(
        long,
        help = "The nodes: comma-separated URLs of independent Redis or Valkey masters \
                (redis://[user:password@]host:port[/db], redis+unix:///path[?db=N]; valkey:// and \
                valkey+unix:// alike; rediss:// and valkeys:// with the tool's `tls` feature). \
                Default: the REDLOCK_NODES environment variable",
        help_heading = NODES,
        value_delimiter = ',',
        value_name = "URL,..."
    )]
    pub nodes: Vec<String>,

    /// How long a round trip to the nodes may take.
    #[arg(long, value_name = "DURATION", value_parser = duration, default_value = "50ms", help_heading = NODES)]
    pub io_timeout: Duration,

    /// How long connecting to a node may take.
    #[arg(long, value_name = "DURATION", value_parser = duration, default_value = "50ms", help_heading = NODES)]
    pub connect_timeout: Duration,

    /// Keep a node that has been up for less than this from voting (it
    /// may have restarted and forgotten locks): at least the longest TTL
    /// in use. Off by default; with it, status counts no such node.
    #[arg(long, value_name = "DURATION", value_parser = duration, help_heading = NODES)]
    pub restart_grace: Option<Duration>,

    /// Machine-readable output: one JSON object on standard output, for
    /// the result and for errors (the message also goes to standard error).
    #[arg(long, help_heading = NODES)]
    pub json: bool,
}

/// How a lock is taken: `run`'s and `acquire`'s.
#[derive(Debug, Args)]
pub struct Acquisition {
    /// How long the lock lasts on the nodes unless extended.
    #[arg(long, value_name = "DURATION", value_parser = ttl, default_value = "30s", help_heading = TAKING)]
    pub ttl: Duration,

    /// Wait at most this long for the lock. Without it (and without
    /// --no-wait), wait until the lock is had, saying on standard error
    /// while too few nodes answer.
    #[arg(
        long,
        value_name = "DURATION",
        value_parser = duration,
        conflicts_with = "no_wait",
        help_heading = TAKING
    )]
    pub wait: Option<Duration>,

    /// Give up at once if the lock is held (like flock -n): one attempt.
    #[arg(short = 'n', long, help_heading = TAKING)]
    pub no_wait: bool,

    // `run` adds to this help ([`watchdog_pause`]); `acquire` never extends.
    /// The pause between two attempts while waiting, plus up to half as
    /// much again at random (so waiters spread out); it ends as soon as
    /// the holder releases the lock.
    #[arg(long, value_name = "DURATION", value_parser = duration, default_value = "200ms", help_heading = TAKING)]
    pub retry_delay: Duration,

    /// The exit code when the lock is held by another client (like
    /// flock -E; default 75); 0 makes "someone else is on it" a success.
    /// With it, finding the lock held prints nothing (unless --verbose;
    /// --json still prints its object): the code says it all.
    #[arg(short = 'E', long, value_name = "N", help_heading = TAKING)]
    pub conflict_exit_code: Option<u8>,

    #[command(flatten)]
    pub kind: KindArgs,

    /// The label stored with the lock on each node, which `redlock status`
    /// shows: who holds it (1 to 200 bytes, no control characters).
    /// Default: `HOST:PID`, this host's name and the pid of the process
    /// that holds the lock. For run, that is redlock itself, which keeps
    /// the lock while the command runs. For acquire, it is the shell or
    /// program that called it.
    #[arg(long, value_name = "LABEL", help_heading = TAKING)]
    pub owner: Option<String>,

    /// Say on standard error when waiting starts and when the lock is had,
    /// and why it was not had (in full, with each node's answer).
    #[arg(short, long, help_heading = TAKING)]
    pub verbose: bool,
}

/// Which kind of lock: `run`'s, `acquire`'s, `extend`'s and `release`'s.
/// Without any, an exclusive lock (the write side of `--shared`).
#[derive(Debug, Args)]
#[group(multiple = false)]
pub struct KindArgs {
    /// A fenced lock: exclusive, with a fencing token, a number larger
    /// than that of every earlier fenced lock on the resource, for the
    /// protected storage to check.
    #[arg(long, help_heading = KIND)]
    pub fenced: bool,

    /// The read side of a read-write lock (like flock -s): any number of
    /// --shared holders at once, or one exclusive holder (a plain or
    /// fenced lock on the same resource), never both. No fencing token.
    #[arg(long, help_heading = KIND)]
    pub shared: bool,

    /// One of K permits: at most K holders at once. Every holder of the
    /// resource must give the same K. A holder needs more than N K / (K + 1)
    /// of the N nodes: a majority for K = 1, 4 of 5 nodes for K = 2 or 3,
    /// all 3 of 3 for K >= 2 (no node may be down). No fencing token.
    #[arg(
        long,
        value_name = "K",
        value_parser = permits,
        help_heading = KIND
    )]
    pub semaphore: Option<u32>,
}

/// The environment variable that gives the nodes when `--nodes` does not.
pub const NODES_VARIABLE: &str = "REDLOCK_NODES";

impl NodeArgs {
    /// The node URLs: `--nodes`, else [`NODES_VARIABLE`] split at commas
    /// (none if it is unset).
    pub fn urls(&self) -> Vec<String> {
        if !self.nodes.is_empty() {
            return self.nodes.clone();
        }
        std::env::var_os(NODES_VARIABLE)
            .map(|urls| {
                let urls = urls.to_string_lossy();
                urls.split(',').map(str::to_string).collect()
            })
            .unwrap_or_default()
    }
}

impl KindArgs {
    /// The kind of lock the flags ask for.
    pub fn kind(&self) -> Kind {
        match (self.fenced, self.shared, self.semaphore) {
            (_, _, Some(permits)) => Kind::Semaphore(permits),
            (_, true, _) => Kind::Shared,
            (true, _, _) => Kind::Fenced,
            _ => Kind::Plain,
        }
    }
}

/// `redlock run`.
#[derive(Debug, Args)]
#[command(
    mut_arg("retry_delay", watchdog_pause),
    about = "Run a command while holding a lock",
    long_about = concat!(
        "Take the lock on RESOURCE, run COMMAND with its arguments while holding it, keep the lock alive \
while the command runs (it is extended each time a third of its validity is left), release it when the \
command ends, and exit with the command's status.\n\n",
        "By default the lock is exclusive: one run at a time. With --shared, the run holds the read side \
(like flock -s): --shared runs on RESOURCE run at once, and a run without --shared (the write side) waits \
until none is left. A waiting exclusive run keeps new --shared runs from starting (it marks its intent on \
the nodes), so readers cannot starve it. With --semaphore K, at most K runs hold RESOURCE at once; every \
run on it must give the same K. Waiting, keeping the lock alive and stopping the command work the same for \
every kind. A lock held as another kind (--semaphore with another K, or --semaphore against --shared) \
is a usage error (64): waiting cannot fix it.\n\n",
        "By default wait for the lock as long as it takes (while too few nodes answer, saying so on standard \
error at once and then at most every 10 s); --wait bounds the wait and --no-wait (-n) gives up at once. \
The wait is not a poll: it ends as soon as the holder releases the lock, whatever --retry-delay. \
When the lock is not had, the command does not run. Nodes that refuse this client (a wrong or missing \
password, a missing ACL permission, a TLS failure, a host that does not exist) are said once; if they leave too few nodes for a quorum, it exits at \
once with 77, waiting or not.\n\n",
        "The command runs in a process group of its own, owned by a small supervisor process (redlock \
itself) that stops the command and every process it started when the lock is no longer kept: if the lock is \
lost (its extension is refused), or is not extended by the time --kill-after (at most a sixth of the TTL) \
is left before it runs out (too few nodes answer, --max-hold is near, or redlock is stopped with SIGSTOP \
or frozen), or redlock dies (even by SIGKILL), they get SIGTERM, then SIGKILL after --kill-after or \
when the lock runs out (or --max-hold is reached), whichever comes first. On Linux that is the command's \
whole process tree, also the steps that left its process group (timeout(1), bash -m, setsid, a daemon's \
double fork): the supervisor is a subreaper, so they stay its descendants. SIGKILL is sent again until none \
is left; elsewhere it is the command's process group. The supervisor is in a process group of \
its own, apart from redlock's: a signal to redlock's group (a job runner's SIGKILL or SIGSTOP, timeout -s KILL) \
does not reach it, and it ends the command as above. redlock then exits with 76 and says on standard error when \
the lock was lost. When the command exits, what it left running gets the same treatment: the lock is \
released only once none of its processes is left.\n\n",
        "A process that SIGKILL does not end (one in uninterruptible sleep, or one run as another user, as \
sudo -u does) keeps the lock: the lock is extended, and the process named on standard error every 5 s, \
until it is gone. --max-hold still ends the hold: the lock is not extended past it. If the lock is lost meanwhile \
(or reaches --max-hold), redlock says so, names the processes left, and exits with 76.\n\n",
        "If the supervisor itself dies (say, by SIGKILL), redlock stops the command's processes (SIGKILL; on \
Linux they come to redlock, also a subreaper), waits for them to be gone, releases the lock and exits \
with 71. Not covered: redlock and its supervisor both killed with SIGKILL at once, and a process handed to \
another service (systemd-run, at, a container runtime), which is not a descendant.\n\n",
        "SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1 and SIGUSR2 sent to redlock are passed on to the command's \
group; the lock is released after the command exits. A signal while still waiting for the lock ends the \
wait at once (within --io-timeout). When \
standard input is the terminal, the command's group is the terminal's foreground group while it runs \
(Ctrl-C and reading the terminal reach it, as for any foreground command), and redlock's is again \
after; so in a pipeline, the other commands (`redlock run ... | less`) cannot read the terminal \
meanwhile. Ctrl-Z does not suspend the command (a suspended job would hold the lock): it is continued at \
once. Standard input, output and error are redlock's, and the exit status is the command's.\n\n",
        "The command's environment gets REDLOCK_RESOURCE, REDLOCK_TOKEN and, with --fenced, \
REDLOCK_FENCING_TOKEN (pass it to the storage you write, which should refuse a token lower than one it \
has seen). The lock is labelled with --owner (default HOST:PID, with the pid of this redlock, which keeps the \
lock), which `redlock status` shows.\n\n",
        nodes_note!()
    ),
    after_help = "Run `redlock run --help` for the exit codes and an example.",
    after_long_help = concat!(
        "Exit codes:\n",
        code_line!("any  ", "the command's own exit status (0 when it succeeded), when it ran with\n         the lock held throughout"),
        usage_code!(";\n         or the lock is held as another kind (--shared, --semaphore K with\n         another K): the command did not run"),
        nodes_code!(),
        system_code!(";\n         or redlock's supervisor died while the command ran: the command's\n         processes were killed before the lock was released"),
        code_line!("75   ", "the lock is held by another client (or was until --wait ran out):\n         the command did not run; --conflict-exit-code changes it"),
        code_line!("76   ", "the lock was lost or about to run out while the command ran, or\n         --max-hold was reached: the command's processes were stopped\n         (SIGTERM, then SIGKILL), or are named as left running; or the lock\n         was lost or about to run out before the command started, which did\n         not run"),
        code_line!("77   ", "too many nodes refuse this client for a quorum (a wrong or missing\n         password, a missing ACL permission, TLS, an unknown host): waiting\n         cannot fix that"),
        code_line!("126  ", "the command was found but could not be run"),
        code_line!("127  ", "the command was not found"),
        code_line!("128+N", "the command died of signal N (the shell's convention); or signal N\n         stopped the wait for the lock"),
        "\nA command may itself exit with 69, 75 or 76; where that must be told apart,\n",
        "pick a --conflict-exit-code it never uses.\n",
        "\nExamples:\n",
        "  # crontab on every host: the report runs on one host at a time, and a host\n",
        "  # that finds it running skips this round quietly (with -E, nothing is printed).\n",
        "  REDLOCK_NODES=redis://h1:6379,redis://h2:6379,redis://h3:6379\n",
        "  */10 * * * *  redlock run -n -E 0 nightly-report -- /usr/local/bin/nightly-report\n",
        "\n",
        "  # a deploy step that waits up to 5 minutes for the previous one\n",
        "  redlock run --wait 5m --ttl 1m deploy:web -- ./deploy.sh --env prod\n",
        "\n",
        "  # a shell command line, as flock -c runs one\n",
        "  redlock run -c 'make && make install' build\n",
        "\n",
        "  # readers at once, or one writer; at most 2 exports at a time\n",
        "  redlock run --shared catalog -- ./read-catalog\n",
        "  redlock run catalog -- ./rewrite-catalog\n",
        "  redlock run --semaphore 2 export -- ./export.sh\n",
    )
)]
pub struct RunArgs {
    #[command(flatten)]
    pub acquisition: Acquisition,

    /// Hold the lock at most this long: it is not extended past it, and the
    /// command's processes get SIGTERM shortly before (--kill-after, at
    /// most a sixth of the shorter of this and the TTL) and SIGKILL at it,
    /// also when it is shorter than the TTL.
    #[arg(long, value_name = "DURATION", value_parser = duration, help_heading = TAKING)]
    pub max_hold: Option<Duration>,

    /// After the lock is lost, how long the command's processes have
    /// between SIGTERM and SIGKILL (and SIGKILL comes when the lock runs out
    /// at the latest).
    #[arg(
        long,
        value_name = "DURATION",
        value_parser = duration,
        default_value = "10s",
        help_heading = RUNNING
    )]
    pub kill_after: Duration,

    #[command(flatten)]
    pub nodes: NodeArgs,

    /// The lock's name (any string but empty), the same on every host.
    pub resource: String,

    /// Run this shell command line (`/bin/sh -c COMMAND`, as flock -c
    /// does) instead of COMMAND and its arguments.
    #[arg(short = 'c', long = "command", value_name = "COMMAND_LINE", help_heading = RUNNING)]
    pub shell: Option<OsString>,

    /// The command to run and its arguments (put `--` before it if an
    /// argument starts with `-`).
    #[arg(
        required_unless_present = "shell",
        conflicts_with = "shell",
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "COMMAND",
        value_parser = clap::value_parser!(OsString)
    )]
    pub command: Vec<OsString>,
}

impl RunArgs {
    /// The command and its arguments: COMMAND..., or `/bin/sh -c` and
    /// the line given with `-c`.
    pub fn argv(&self) -> Vec<OsString> {
        match &self.shell {
            Some(line) => vec!["/bin/sh".into(), "-c".into(), line.clone()],
            None => self.command.clone(),
        }
    }
}

/// `redlock acquire`.
#[derive(Debug, Args)]
#[command(
    about = "Take a lock and print its token",
    long_about = concat!(
        "Take the lock on RESOURCE and print its token on standard output (with --fenced, the token and the \
fencing token, separated by a space). The lock is not kept alive: it expires after --ttl unless \
`redlock extend` renews it in time, and `redlock release` gives it back. For scripts that take and give \
back a lock in separate steps; `redlock run` is simpler where it fits.\n\n",
        "--shared takes the read side of a read-write lock, --semaphore K one of K permits (see `redlock run \
--help`). Give `extend` and `release` the same kind flag: they need it to find the lock. The lock is \
labelled with --owner, which `redlock status` shows. Its default is HOST:PID, with the pid of the shell \
or program that called `redlock acquire` (redlock itself exits at once).\n\n",
        "Waits as `redlock run` does (--wait, --no-wait; while too few nodes answer, it says so on standard \
error; the wait ends as soon as the holder releases the lock); a signal while waiting ends the wait at once \
(within --io-timeout).\n\n",
        nodes_note!()
    ),
    after_help = "Run `redlock acquire --help` for the exit codes and an example.",
    after_long_help = concat!(
        "Exit codes:\n",
        code_line!("0    ", "the lock is had: its token was printed"),
        usage_code!(";\n         or the lock is held as another kind (--shared, --semaphore K with\n         another K)"),
        nodes_code!(),
        system_code!(),
        code_line!("74   ", "the token could not be printed (standard output closed, a broken\n         pipe, a full disk): the lock was released, or never taken"),
        code_line!("75   ", "the lock is held by another client (or was until --wait ran out);\n         --conflict-exit-code changes it"),
        code_line!("77   ", "too many nodes refuse this client for a quorum (a wrong or missing\n         password, a missing ACL permission, TLS, an unknown host): waiting\n         cannot fix that"),
        code_line!("128+N", "signal N stopped the wait"),
        "\nExample:\n",
        "  token=$(redlock acquire --ttl 5m migrate) || exit\n",
        "  ./migrate step-1 && redlock extend --ttl 5m migrate \"$token\" && ./migrate step-2\n",
        "  redlock release migrate \"$token\"\n",
        "\n",
        "  token=$(redlock acquire --semaphore 3 export) || exit\n",
        "  ./export.sh; redlock release --semaphore 3 export \"$token\"\n",
    )
)]
pub struct AcquireArgs {
    #[command(flatten)]
    pub acquisition: Acquisition,

    #[command(flatten)]
    pub nodes: NodeArgs,

    /// The lock's name (any string but empty).
    pub resource: String,
}

/// `redlock extend`.
#[derive(Debug, Args)]
#[command(
    mut_arg("fenced", fenced_as_plain),
    about = "Extend a lock taken with acquire",
    long_about = concat!(
        "Make the lock on RESOURCE that TOKEN holds last --ttl from now, if a quorum of nodes still holds \
it. Prints nothing (with --json: the validity left).\n\n",
        kind_note!(),
        "When too few nodes answer, it tries again up to 3 times, each after 200 ms plus up to 100 ms at \
random (as the library does by default); when too many nodes no longer \
hold the token, the lock is lost and it does not try again.\n\n",
        nodes_note!()
    ),
    after_help = "Run `redlock extend --help` for the exit codes and an example.",
    after_long_help = concat!(
        "Exit codes:\n",
        code_line!("0    ", "extended"),
        usage_code!(";\n         or the lock is held as another kind than the one given: --shared or\n         --semaphore K for an exclusive lock, none for a shared or counted\n         one, or another K; nothing changed on the nodes"),
        nodes_code!(),
        system_code!(),
        code_line!("76   ", "the lock was lost: it had expired, or another client holds it now"),
        "\nExample:\n",
        "  redlock extend --ttl 5m migrate \"$token\" || { echo 'lost the lock' >&2; exit 1; }\n",
        "  redlock extend --shared --ttl 5m catalog \"$token\"\n",
    )
)]
pub struct ExtendArgs {
    /// How long the lock lasts from now.
    #[arg(long, value_name = "DURATION", value_parser = ttl, default_value = "30s")]
    pub ttl: Duration,

    #[command(flatten)]
    pub nodes: NodeArgs,

    #[command(flatten)]
    pub lock: LockRef,
}

/// `redlock release`.
#[derive(Debug, Args)]
#[command(
    mut_arg("fenced", fenced_as_plain),
    about = "Release a lock taken with acquire",
    long_about = concat!(
        "Release the lock on RESOURCE that TOKEN holds: delete it on every node that still holds that \
token, and nothing else. Prints nothing (with --json: what each node answered).\n\n",
        kind_note!(),
        nodes_note!()
    ),
    after_help = "Run `redlock release --help` for the exit codes and an example.",
    after_long_help = concat!(
        "Exit codes:\n",
        code_line!("0    ", "released"),
        usage_code!(";\n         or the lock is held as another kind than the one given (--shared,\n         --semaphore K): nothing was released"),
        nodes_code!(),
        system_code!(),
        code_line!("76   ", "the lock was not held any more: it had expired (and may have been\n         taken); the work done under it may have overlapped another holder's"),
        "\nExample:\n",
        "  redlock release migrate \"$token\"\n",
        "  redlock release --semaphore 3 export \"$token\"\n",
    )
)]
pub struct ReleaseArgs {
    #[command(flatten)]
    pub nodes: NodeArgs,

    #[command(flatten)]
    pub lock: LockRef,
}

/// A lock taken by `redlock acquire`, named by its resource, token and
/// kind: `extend`'s and `release`'s operands.
#[derive(Debug, Args)]
pub struct LockRef {
    #[command(flatten)]
    pub kind: KindArgs,

    /// The lock's name.
    pub resource: String,

    /// The token `redlock acquire` printed (40 lowercase hex characters).
    pub token: String,
}

/// `redlock status`.
#[derive(Debug, Args)]
#[command(
    about = "Show what each node holds for a lock",
    long_about = concat!(
        "Show what each node holds for RESOURCE right now: free, held by one exclusive holder, or by \
--shared or --semaphore holders; for each holder its token by its first 8 characters (the whole token \
would let anyone release the lock), its owner label (--owner; HOST:PID by default) and the time left; \
and the fencing counter. Then what a quorum says, each holder on its own kind's quorum: held by one \
token, or by which shared or counted holders (the first 100, and their count; for a semaphore of K \
permits, how many are left), or by an application's key that is not a lock (its type named), or free. \
A waiting writer's intent shows too: new readers held back, and for how long. Read-only: one \
read-only script on each node.\n\n",
        "When the nodes that did not answer could complete a quorum, whether the lock is held cannot be \
told: it says \"unknown\" (with --json, \"held\": null) and exits with 69.\n\n",
        nodes_note!()
    ),
    after_help = "Run `redlock status --help` for the exit codes and an example.",
    after_long_help = concat!(
        "Exit codes:\n",
        code_line!("0    ", "enough nodes answered to tell whether the lock is held"),
        usage_code!(),
        nodes_code!(),
        system_code!(),
        "\nExample:\n",
        "  redlock status nightly-report\n",
        "  redlock status --json nightly-report | jq .held\n",
        "  redlock status --json export | jq '.holders[].owner, .permits_left'\n",
    )
)]
pub struct StatusArgs {
    #[command(flatten)]
    pub nodes: NodeArgs,

    /// The lock's name.
    pub resource: String,
}

/// `redlock man`.
#[derive(Debug, Args)]
#[command(
    about = "Print the manual pages (roff)",
    long_about = "Print redlock's manual page (roff), made from this help, on standard output; with \
SUBCOMMAND, that subcommand's page (redlock-run(1) and so on); with --dir, write every page into DIR \
instead, creating DIR and its parents if need be. Read one with `redlock man run | man -l -`; install them all with \
`redlock man --dir ~/.local/share/man/man1` (or /usr/local/share/man/man1).",
    after_long_help = concat!(
        "Exit codes:\n",
        code_line!("0    ", "printed, or written"),
        code_line!("64   ", "usage: an unknown subcommand"),
        code_line!("74   ", "standard output, or a file in DIR, could not be written"),
    )
)]
pub struct ManArgs {
    /// The subcommand whose page to print (run, acquire, extend, release,
    /// status, man, completions).
    pub subcommand: Option<String>,

    /// Write every page (redlock.1, redlock-run.1, ...) into this
    /// directory instead.
    #[arg(long, value_name = "DIR", conflicts_with = "subcommand")]
    pub dir: Option<std::path::PathBuf>,
}

/// `redlock completions`.
#[derive(Debug, Args)]
#[command(
    about = "Print a shell completion script",
    long_about = "Print the completion script for SHELL on standard output. For bash:\n\n\
  redlock completions bash > ~/.local/share/bash-completion/completions/redlock\n\n\
for zsh, into a directory of $fpath as `_redlock`; for fish, into \
~/.config/fish/completions/redlock.fish.",
    after_long_help = concat!(
        "Exit codes:\n",
        code_line!("0    ", "printed"),
        code_line!("64   ", "usage: an unknown shell"),
        code_line!("74   ", "standard output could not be written"),
    )
)]
pub struct CompletionsArgs {
    /// The shell: bash, elvish, fish, powershell or zsh.
    #[arg(value_enum)]
    pub shell: clap_complete::Shell,
}

/// The hidden `redlock supervise`: what `run` starts to own the command
/// (see `supervisor.rs`). Not for people: its interface may change.
#[derive(Debug, Args)]
pub struct SuperviseArgs {
    /// The pipe (an inherited descriptor) that brings `run`'s messages.
    #[arg(long)]
    pub control_fd: i32,
    /// The pipe (an inherited descriptor) to report to `run` on.
    #[arg(long)]
    pub report_fd: i32,
    /// The pid of `run`: the supervisor's parent.
    #[arg(long)]
    pub parent: i32,
    /// The lock's validity deadline: nanoseconds of the monotonic clock.
    #[arg(long)]
    pub deadline_ns: u64,
    /// SIGTERM this many milliseconds before the deadline, if no later
    /// deadline came.
    #[arg(long)]
    pub warn_ms: u64,
    /// --kill-after, in milliseconds.
    #[arg(long)]
    pub kill_after_ms: u64,
    /// The lock's name, for messages.
    #[arg(long)]
    pub resource: String,
    #[arg(long)]
    pub verbose: bool,
    /// The command and its arguments.
    #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true, value_parser = clap::value_parser!(OsString))]
    pub command: Vec<OsString>,
}

/// `run`'s `--retry-delay`: the shared help, and what it is to the
/// watchdog (run.rs gives the library's retry pause the same value).
fn watchdog_pause(arg: clap::Arg) -> clap::Arg {
    let shared = arg.get_help().map(ToString::to_string).unwrap_or_default();
    arg.help(format!(
        "{shared}. Also the pause before the watchdog retries a failed extension while the command runs"
    ))
}

/// `extend`'s and `release`'s `--fenced`: accepted, so that the flags of
/// `acquire` work as they are; a fenced lock is found as a plain one.
fn fenced_as_plain(arg: clap::Arg) -> clap::Arg {
    arg.help("A fenced lock: the same as none here (a fenced lock is extended and released as a plain one)")
}

/// The least TTL the tool takes, in milliseconds. The lock must outlast
/// the allowance for clock drift, 2 ms and 1% of the TTL (the library's
/// default, which the tool keeps): 3 ms is the least whole number that
/// does. tests/scripts.rs checks that the library takes it.
pub const LEAST_TTL_MS: u64 = 3;

/// Parses `--ttl`: a duration of at least [`LEAST_TTL_MS`].
fn ttl(s: &str) -> Result<Duration, String> {
    let ttl = duration(s)?;
    if ttl < Duration::from_millis(LEAST_TTL_MS) {
        return Err(format!(
            "a TTL must be at least {LEAST_TTL_MS} ms, to outlast the allowance for clock drift; \
             give one long enough for the work (seconds are usual)"
        ));
    }
    Ok(ttl)
}

/// Parses `--semaphore`'s K: a number of permits, at least 1.
fn permits(s: &str) -> Result<u32, String> {
    match s.parse::<u32>() {
        Ok(0) => Err("a semaphore needs at least 1 permit".to_string()),
        Ok(permits) => Ok(permits),
        Err(e) => Err(format!("{e}; give the number of permits, such as 2")),
    }
}

/// Parses a human duration: `500ms`, `30s`, `5m`, `1h 30m`.
fn duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s)
        .map_err(|e| format!("{e}; give a duration such as 500ms, 30s, 5m or 1h30m"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_command_line_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    /// A struct's `next_help_heading` once put them under "Nodes:", and
    /// `<COMMAND>...` before `<RESOURCE>`.
    #[test]
    fn positional_arguments_are_listed_under_arguments_in_their_order() {
        let expected: &[(&str, &[&str])] = &[
            ("run", &["<RESOURCE>", "[COMMAND]..."]),
            ("acquire", &["<RESOURCE>"]),
            ("extend", &["<RESOURCE>", "<TOKEN>"]),
            ("release", &["<RESOURCE>", "<TOKEN>"]),
            ("status", &["<RESOURCE>"]),
        ];
        let mut cli = Cli::command();
        for (name, positionals) in expected {
            let sub = cli.find_subcommand_mut(name).expect("a subcommand");
            for short in [false, true] {
                let help = if short {
                    sub.render_help()
                } else {
                    sub.render_long_help()
                }
                .to_string();
                let block = help
                    .split_once("\nArguments:\n")
                    .and_then(|(_, rest)| rest.split_once("\nOptions:\n"))
                    .map(|(block, _)| block)
                    .unwrap_or_else(|| panic!("{name}: no Arguments before Options: {help}"));
                let at: Vec<usize> = positionals
                    .iter()
                    .map(|p| {
                        block
                            .find(&format!("  {p}"))
                            .unwrap_or_else(|| panic!("{name}: {p} not under Arguments: {help}"))
                    })
                    .collect();
                assert!(at.is_sorted(), "{name}: out of order: {block}");
                let rest = &help[help.find("\nOptions:\n").unwrap()..];
                assert!(
                    !rest.contains("  <"),
                    "{name}: a positional after Options: {help}"
                );
            }
        }
    }

    #[test]
    fn each_subcommand_says_how_it_pauses_and_retries() {
        let mut cli = Cli::command();
        let mut help = |name: &str| {
            let sub = cli.find_subcommand_mut(name).expect("a subcommand");
            sub.render_long_help().to_string().replace('\n', " ")
        };
        let (run, acquire, extend) = (help("run"), help("acquire"), help("extend"));
        assert!(run.contains("watchdog retries a failed extension"), "{run}");
        assert!(
            !acquire.contains("extension"),
            "acquire never extends: {acquire}"
        );
        for says in ["3 times", "200 ms", "100 ms"] {
            assert!(extend.contains(says), "extend --help should say {says:?}");
        }
    }

    #[test]
    fn the_help_names_every_node_url_scheme() {
        let mut cli = Cli::command();
        for help in [
            cli.render_long_help().to_string(),
            cli.find_subcommand_mut("status")
                .expect("status")
                .render_help()
                .to_string(),
        ] {
            let help = help.replace(char::is_whitespace, "");
            for scheme in [
                "redis://",
                "redis+unix://",
                "valkey://",
                "valkey+unix://",
                "rediss://",
                "valkeys://",
                "`tls`feature",
            ] {
                assert!(help.contains(scheme), "no {scheme}: {help}");
            }
        }
    }

    #[test]
    fn durations_take_human_units() {
        assert_eq!(duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(duration("5m"), Ok(Duration::from_secs(300)));
        assert!(duration("5 parsecs").unwrap_err().contains("such as 500ms"));
    }
}
