//! `ethand`: the daemon and its CLI. This file only parses flags and wires crates together.

use std::{
    io::{IsTerminal as _, Write as _},
    path::PathBuf,
    process::ExitCode,
    time::Duration,
};

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use ethand::{
    EXIT_FAILURE, EXIT_USAGE,
    commands::{self, compare, record, snapshot, survey},
    config,
    config::Config,
    privilege::stats_helper,
    serve::{api, daemon, tree::Samples},
};
use ethand_exporters::terminal;
use ethand_snapshot::GpuLevel;

#[derive(Parser, Debug)]
#[command(
    name = "ethand",
    version,
    about = "Always-on eBPF observability for GPU/NPU compute nodes"
)]
struct Cli {
    /// Configuration file (TOML); merged over the embedded defaults.
    #[arg(long, global = true, env = "ETHAND_CONFIG")]
    config: Option<PathBuf>,
    /// Local API socket (overrides daemon.socket).
    #[arg(long, global = true)]
    socket: Option<PathBuf>,
    /// How long `status`, `snapshot` and `level` wait for the daemon's answer (seconds).
    #[arg(long, global = true, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=3600))]
    timeout: u64,
    /// Log progress on stderr: -v info, -vv debug (commands other than `run`, which logs at
    /// daemon.log; RUST_LOG overrides both).
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    verbose: u8,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run the daemon in the foreground: attach probes, serve /metrics and the local API.
    Run {
        /// Address for /metrics (overrides prometheus.listen).
        #[arg(long)]
        listen: Option<String>,
    },
    /// What is attached, what is not and why; map fill; ethand's own cost.
    Status {
        #[arg(long)]
        json: bool,
    },
    /// One process and its descendants: CPU, scheduler, syscalls, disk and network.
    Snapshot {
        #[arg(long)]
        pid: u32,
        /// Print the complete snapshot as JSON (schema: docs/snapshot-schema.md).
        #[arg(long)]
        json: bool,
        /// Print the snapshot's metrics as CSV: scope,metric,value,unit (one row per metric
        /// of the tree and of each process, then one per finding).
        #[arg(long, conflicts_with = "json")]
        csv: bool,
        /// Also write a self-contained HTML report (findings, charts, process tree) to FILE.
        #[arg(long, value_name = "FILE")]
        html: Option<PathBuf>,
        /// Window for the "recent" figures when a daemon runs (seconds; at most
        /// daemon.history_seconds are kept).
        #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=86_400))]
        window: u64,
        /// Without a daemon: how long to measure with ethand's own probes (seconds).
        #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..=3600))]
        duration: u64,
        /// Measure with ethand's own probes for --duration even when a daemon runs.
        #[arg(long)]
        standalone: bool,
        /// Do not count kernel launches on demand (at level `calls` the launch-based rules
        /// then say they could not run).
        #[arg(long)]
        no_launch_sample: bool,
        /// Do not sample the tree's Python frames nor profile its threads natively (the
        /// findings then name no Python line and say nothing of where CPU time goes or
        /// threads wait).
        #[arg(long)]
        no_stack_sample: bool,
        /// Profile the tree's threads natively (CPU time by library and function, where they
        /// wait) even when it has no Python process and no launch sample to wait for: the
        /// snapshot then takes diagnosis.stack_sample_ms longer. Standalone snapshots always
        /// profile.
        #[arg(long, conflicts_with = "no_stack_sample")]
        cpu_profile: bool,
    },
    /// Run the diagnosis rules (built-in plus diagnosis.rules_dir) over a saved
    /// `ethand snapshot --json` file: the findings, and which rules could not run and why.
    /// Needs no daemon.
    Diagnose {
        /// The snapshot (JSON file; "-" reads standard input).
        file: PathBuf,
        /// Print the findings as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Switch the GPU/NPU probing level of the running daemon, live: system (device metrics
    /// only, no uprobes), calls (memory, copies, syncs, collectives: every probed call but
    /// kernel launches; the default), process (also kernel launches) or op (also the host
    /// time of every probed call).
    Level {
        #[arg(value_parser = gpu_level_parser())]
        level: GpuLevel,
    },
    /// Diagnostic for a library version ethand has not met: probe every exported function
    /// of LIBRARY whose name starts with PREFIX, count calls per process for a while and
    /// print which ones a workload really calls (standalone; needs no daemon).
    Survey {
        /// Path of the library file (as mapped by the workload; /proc/PID/root/... for
        /// containers).
        #[arg(long)]
        library: PathBuf,
        #[arg(long, default_value = "cu")]
        prefix: String,
        /// Seconds to count.
        #[arg(long, default_value_t = 10)]
        duration: u64,
        /// Only this process.
        #[arg(long)]
        pid: Option<u32>,
    },
    /// Record a timeline of one process tree (scheduler slices, slow syscalls, block IO,
    /// GPU/NPU runtime calls, CPU and Python samples) and write it as a Perfetto trace (open
    /// it at ui.perfetto.dev) or, for a FILE ending in .json, a Chrome JSON trace.
    /// Standalone; needs no daemon.
    Record {
        /// The root of the tree: this process and its descendants (also those forked while
        /// recording).
        #[arg(long)]
        pid: u32,
        /// How long to record: 10s, 500ms, 2m (a bare number is seconds; at most 1h; default
        /// 10s, with --ring 1h). The recording ends earlier when every process of the tree
        /// has exited, or on SIGINT, SIGTERM or SIGHUP (the trace is kept).
        #[arg(long, value_parser = record::parse_duration)]
        duration: Option<Duration>,
        /// Ring mode: keep only the last DURATION of the recording (30s, 2m; Perfetto output
        /// only), so it can stay on until the moment of interest and be stopped then with
        /// SIGINT or SIGTERM. Written as segments in a private directory beside FILE, the
        /// oldest deleted as newer ones cover DURATION; with --max-size, also kept under
        /// that many bytes (instead of ending the recording).
        #[arg(long, value_parser = record::parse_duration)]
        ring: Option<Duration>,
        /// Output file: Perfetto's protobuf format (compressed; trace.pftrace), or a Chrome
        /// JSON trace if FILE ends in .json; give -o twice for both from the same events.
        /// Streamed to a new file with a random name beside FILE while recording (bounded
        /// memory), renamed to FILE once complete (a symlink at FILE is replaced, never
        /// followed); on a write error (e.g. a full disk) it is removed.
        #[arg(short = 'o', long = "output", required = true)]
        output: Vec<PathBuf>,
        /// End the recording once an output has this many bytes on disk (100M, 2G, 512k;
        /// what is buffered is written after: Perfetto output ends up to about 1 MiB over);
        /// with --ring, the most the ring keeps.
        #[arg(long, value_parser = record::parse_size)]
        max_size: Option<u64>,
        /// Record syscalls at least this long (microseconds).
        #[arg(long, default_value_t = 100)]
        syscall_threshold_us: u64,
        /// Sample the tree's threads on the CPU this many times a second (a perf event on
        /// every CPU), each sample an instant on its thread's track with its user and kernel
        /// stack; 0: no samples. At most 999.
        #[arg(long, default_value_t = 99, value_parser = clap::value_parser!(u32).range(0..1000))]
        cpu_sample_hz: u32,
        /// Read the Python stacks of the tree's Python processes this many times a second,
        /// from outside them (they are never stopped), each read an instant per thread with
        /// its Python frames; 0: none. Each read costs ethand 0.1 to 1 ms of CPU per process.
        /// At most 999.
        #[arg(long, default_value_t = 19, value_parser = clap::value_parser!(u32).range(0..1000))]
        python_sample_hz: u32,
    },
    /// Compare two `ethand snapshot --pid PID --json` files (e.g. before and after a
    /// change): tree totals, rates per second and derived signals, and which findings were
    /// resolved, are new or remain. Needs no daemon.
    Compare {
        /// The earlier snapshot (JSON file).
        before: PathBuf,
        /// The later snapshot (JSON file).
        after: PathBuf,
        /// Print the comparison as JSON.
        #[arg(long, conflicts_with = "csv")]
        json: bool,
        /// Print the comparison as CSV: scope,metric,unit,before,after,change,ratio.
        #[arg(long)]
        csv: bool,
        /// Also write the comparison as one self-contained HTML page.
        #[arg(long, value_name = "FILE")]
        html: Option<PathBuf>,
    },
    /// Print the shell completion script for SHELL (bash, zsh, fish, elvish, powershell).
    Completions { shell: clap_complete::Shell },
    /// Print the man page (roff), generated from this command line's definition.
    #[command(hide = true)]
    Man,
    /// The daemon's BPF statistics helper (started by `ethand run`; stats_helper.rs).
    #[command(hide = true, name = "bpf-stats-helper")]
    BpfStatsHelper {
        #[arg(long)]
        user: Option<String>,
    },
    /// The reader of other users' files and memory (started by `ethand run`, `snapshot` and
    /// `record`; the ethand-reader crate).
    #[command(hide = true, name = "reader")]
    Reader {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Configuration helpers.
    Config {
        #[command(subcommand)]
        command: ConfigCommand,
    },
}

#[derive(Subcommand, Debug)]
enum ConfigCommand {
    /// Print the effective configuration (defaults merged with --config).
    Show,
    /// Print the embedded default configuration, with its documentation.
    Default,
}

/// `ethand level NAME`: the level's names as clap's possible values (its refusal and help
/// list them), parsed into the level.
fn gpu_level_parser() -> impl clap::builder::TypedValueParser<Value = GpuLevel> {
    use clap::builder::TypedValueParser as _;
    clap::builder::PossibleValuesParser::new(GpuLevel::ALL.map(GpuLevel::as_str))
        .map(|name| name.parse().expect("one of the possible values"))
}

fn main() -> ExitCode {
    // Two malloc arenas: glibc's default (8 per core) lets each tokio and collector thread
    // keep its own free memory resident. A fixed mmap threshold: glibc raises it (up to
    // 32 MiB) after the first large buffer is freed, and from then on every round's map-read
    // and snapshot buffers came from the heap and stayed resident after use (RSS 50.7 MB
    // against 40 MB under 10,000 process births/s at the default interval).
    // SAFETY: mallopt before any other thread exists.
    #[cfg(target_env = "gnu")]
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 2);
        libc::mallopt(libc::M_MMAP_THRESHOLD, 128 << 10);
    }
    let cli = Cli::parse();
    // Generated from the CLI definition; needs no configuration.
    match &cli.command {
        // Built whole, then written: clap_complete panics on a failed write.
        Command::Completions { shell } => {
            let mut out = Vec::new();
            clap_complete::generate(
                *shell,
                &mut <Cli as clap::CommandFactory>::command(),
                "ethand",
                &mut out,
            );
            return exit(ethand::write_stdout(out).map(|()| 0));
        }
        Command::Man => {
            let man = clap_mangen::Man::new(<Cli as clap::CommandFactory>::command());
            let mut out = Vec::new();
            let written = man
                .render(&mut out)
                .context("cannot render the man page")
                .and_then(|()| ethand::write_stdout(out));
            return exit(written.map(|()| 0));
        }
        // Single-threaded, before any configuration or runtime: it only drops to
        // CAP_SYS_ADMIN and answers bytes.
        Command::BpfStatsHelper { user } => {
            return ExitCode::from(stats_helper::main(user.as_deref()));
        }
        // Single-threaded too: it forks a worker per session.
        Command::Reader { args } => {
            return match ethand_reader::supervisor::Args::parse(args.iter().cloned()) {
                Ok(a) => ExitCode::from(ethand_reader::supervisor::main(a)),
                Err(e) => {
                    eprintln!("ethand reader: {e}");
                    ExitCode::from(EXIT_USAGE)
                }
            };
        }
        _ => {}
    }
    let mut cfg = match Config::load(cli.config.as_deref()) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("ethand: error: {e}");
            return ExitCode::from(EXIT_USAGE);
        }
    };
    if let Some(s) = &cli.socket {
        if let Err(e) = config::check_socket_path(s) {
            eprintln!("ethand: error: --socket: {e}");
            return ExitCode::from(EXIT_USAGE);
        }
        cfg.daemon.socket = s.clone();
    }
    if let Command::Run { listen: Some(l) } = &cli.command {
        let overlay = format!("[prometheus]\nlisten = {:?}\n", l);
        match Config::from_overlay(&overlay, "--listen") {
            Ok(_) => cfg.prometheus.listen = l.clone(),
            Err(_) => {
                eprintln!("ethand: error: --listen {l:?} is not an address like 127.0.0.1:9477");
                return ExitCode::from(EXIT_USAGE);
            }
        }
    }
    // The CLI's own measurements (standalone snapshot, record, survey) log what they attach
    // at info: noise to whoever only wants the answer.
    let filter = std::env::var("RUST_LOG").unwrap_or_else(|_| match (&cli.command, cli.verbose) {
        (Command::Run { .. }, _) => cfg.daemon.log.clone(),
        (_, 0) => "warn".into(),
        (_, 1) => "info".into(),
        _ => "debug".into(),
    });
    // Third-party crates (py-spy, blazesym, aya, hyper...) at warn unless named: their INFO
    // lines are not ethand's news. RUST_LOG is taken as given.
    let filter = match std::env::var("RUST_LOG") {
        Ok(_) => filter,
        Err(_) => ethand::config::log_filter::with_quiet_dependencies(&filter),
    };
    // Colours only for a terminal: never into the journal, a file or a pipe.
    let ansi = std::io::stderr().is_terminal()
        && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
        .with_writer(std::io::stderr)
        .with_ansi(ansi)
        .init();
    // A bounded blocking pool: the unit's TasksMax counts threads, and nothing ethand does
    // needs more than a few at once (the API builds two snapshots at a time).
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .max_blocking_threads(16)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("ethand: error: cannot start the runtime: {e}");
            return ExitCode::from(EXIT_FAILURE);
        }
    };
    let timeout = Duration::from_secs(cli.timeout);
    exit(rt.block_on(dispatch(cli.command, cfg, timeout)))
}

fn exit(result: anyhow::Result<u8>) -> ExitCode {
    match result {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            // Not eprintln!: a closed stderr must not turn an error into a panic.
            let _ = writeln!(std::io::stderr(), "ethand: error: {}", one_line(&e));
            ExitCode::from(ethand::exit_code(&e))
        }
    }
}

fn one_line(e: &anyhow::Error) -> String {
    e.chain()
        .map(|c| c.to_string())
        .collect::<Vec<_>>()
        .join(": ")
        .replace('\n', " ")
}

/// One request to the running daemon; any failure is an error (no daemon included).
async fn ask(
    cfg: &Config,
    req: api::Request,
    timeout: Duration,
) -> anyhow::Result<serde_json::Value> {
    match api::call(&cfg.daemon.socket, &req, timeout).await? {
        api::Response::Ok(v) => Ok(v),
        api::Response::NotFound(m) | api::Response::Error(m) => anyhow::bail!(m),
    }
}

async fn dispatch(cmd: Command, cfg: Config, timeout: Duration) -> anyhow::Result<u8> {
    match cmd {
        Command::Completions { .. }
        | Command::Man
        | Command::BpfStatsHelper { .. }
        | Command::Reader { .. } => Ok(0),
        Command::Run { .. } => {
            daemon::run(cfg).await?;
            Ok(0)
        }
        Command::Config {
            command: ConfigCommand::Show,
        } => {
            ethand::write_stdout(cfg.to_toml())?;
            Ok(0)
        }
        Command::Config {
            command: ConfigCommand::Default,
        } => {
            ethand::write_stdout(config::DEFAULT_TOML)?;
            Ok(0)
        }
        Command::Status { json } => {
            let v = ask(&cfg, api::Request::Status, timeout).await?;
            if json {
                ethand::write_stdout(serde_json::to_string_pretty(&v)? + "\n")?;
            } else {
                let s: ethand_snapshot::SelfStatus = serde_json::from_value(v)?;
                ethand::write_stdout(terminal::status(&s))?;
            }
            Ok(0)
        }
        Command::Snapshot {
            pid,
            json,
            csv,
            html,
            window,
            duration,
            standalone,
            no_launch_sample,
            no_stack_sample,
            cpu_profile,
        } => {
            snapshot::run(
                cfg,
                pid,
                snapshot::SnapshotFormat { json, csv, html },
                window,
                duration,
                standalone,
                Samples {
                    launches: !no_launch_sample,
                    stacks: !no_stack_sample,
                    profile: cpu_profile.then_some(true),
                },
                timeout,
            )
            .await
        }
        Command::Diagnose { file, json } => commands::diagnose::run(&cfg, &file, json),
        Command::Compare {
            before,
            after,
            json,
            csv,
            html,
        } => compare::run_with_html(
            html.as_deref(),
            &before,
            &after,
            if json {
                compare::Format::Json
            } else if csv {
                compare::Format::Csv
            } else {
                compare::Format::Text
            },
        ),
        Command::Survey {
            library,
            prefix,
            duration,
            pid,
        } => survey::run(&cfg, &library, &prefix, Duration::from_secs(duration), pid).await,
        Command::Record {
            pid,
            duration,
            ring,
            output,
            max_size,
            syscall_threshold_us,
            cpu_sample_hz,
            python_sample_hz,
        } => {
            record::run(
                &cfg,
                record::Options {
                    pid,
                    duration: record::duration_or_default(duration, ring),
                    ring,
                    outputs: &output,
                    max_size,
                    syscall_threshold_us,
                    cpu_sample_hz,
                    python_sample_hz,
                },
            )
            .await
        }
        Command::Level { level } => {
            // The daemon applies a level within 10 s: wait at least that long for it.
            let v = ask(
                &cfg,
                api::Request::SetLevel { level },
                timeout.max(Duration::from_secs(12)),
            )
            .await?;
            let msg = terminal::clean(v["message"].as_str().unwrap_or_default());
            ethand::write_stdout(format!("{msg}\n"))?;
            Ok(0)
        }
    }
}
