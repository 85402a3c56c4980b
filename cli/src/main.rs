//! `tollgate`: see what a rate limit does before it ships. See the crate's documentation and the
//! guide's chapter on the command (`src/guide/cli.md`).

use std::fs::File;
use std::io::{self, BufReader, IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::Value;

use tollgate_cli::check;
use tollgate_cli::descriptors::DescriptorMap;
use tollgate_cli::log::{self, FieldMap, Format};
use tollgate_cli::replay;
use tollgate_cli::report;
use tollgate_cli::run::Runner;
use tollgate_cli::simulate::{self, Traffic, SCENARIOS};
use tollgate_cli::stats::Tally;

#[derive(Parser)]
#[command(
    name = "tollgate",
    version,
    about = "See what a rate limit does before it ships"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Validate a configuration file as the layer would, and print its rules in plain words.
    /// Exit status 0 when valid, 1 when not.
    Check {
        /// The configuration (.toml, .yaml or .yml).
        #[arg(long)]
        config: PathBuf,
    },
    /// Run an access log through a configuration's rules, at the log's timestamps.
    Replay {
        /// The configuration (.toml, .yaml or .yml).
        #[arg(long)]
        config: PathBuf,
        /// The access log (`-` for standard input).
        #[arg(long)]
        log: PathBuf,
        /// The log's format.
        #[arg(long, value_enum, default_value = "combined")]
        format: Format,
        /// For json and csv logs: which field gives a part of the request, TARGET=FIELD, where
        /// TARGET is time, method, path, request, peer or header:NAME (repeatable). Defaults:
        /// time=time, method=method, path=path, request=request, peer=remote_addr.
        #[arg(long = "field", value_name = "TARGET=FIELD")]
        fields: Vec<String>,
        /// A second configuration run over the same log, shown side by side.
        #[arg(long, value_name = "OTHER")]
        compare: Option<PathBuf>,
        /// For a tollgate-server configuration: one descriptor each line sends, as
        /// KEY=SOURCE entries separated by commas, SOURCE one of peer, path, method,
        /// header:NAME, literal:VALUE (repeatable; e.g. remote_address=peer, or
        /// generic_key=literal:slowpath,remote_address=peer). A descriptor whose header or peer a
        /// line lacks is not sent.
        #[arg(long = "descriptor", value_name = "ENTRIES")]
        descriptors: Vec<String>,
        /// For a tollgate-server configuration of several domains: the one the lines are sent in.
        #[arg(long)]
        domain: Option<String>,
        #[command(flatten)]
        output: Output,
    },
    /// Send synthetic traffic through rules: from a configuration file, from --rule, or a ready
    /// scenario (--scenario).
    Simulate {
        /// A configuration whose rules run together, as the layer runs them.
        #[arg(long, conflicts_with_all = ["rules", "scenario"])]
        config: Option<PathBuf>,
        /// A rule, `name=api,rate=10,period=1s,capacity=20` with the configuration file's setting
        /// names (key defaults to peer_ip); several run side by side, each on its own.
        #[arg(long = "rule", value_name = "SETTINGS", conflicts_with = "scenario")]
        rules: Vec<String>,
        /// Traffic from every client: steady:RATE, poisson:RATE (per second) or
        /// burst:N/EVERY[+AT] (repeatable).
        #[arg(
            long = "traffic",
            value_name = "SPEC",
            default_value = "steady:10",
            conflicts_with = "scenario"
        )]
        traffic: Vec<String>,
        /// How many clients (peers 10.0.x.y) send the traffic.
        #[arg(long, default_value_t = 1, conflicts_with = "scenario")]
        clients: u64,
        /// How long, e.g. 60s or 10m.
        #[arg(long, default_value = "60s", conflicts_with = "scenario")]
        duration: String,
        /// The seed of Poisson arrivals.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// A ready scenario: window-edge, bucket-burst, smoothing or queue-pacing.
        #[arg(long)]
        scenario: Option<String>,
        /// List the ready scenarios.
        #[arg(long)]
        list_scenarios: bool,
        #[command(flatten)]
        output: Output,
    },
}

#[derive(clap::Args)]
struct Output {
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
    /// Also write an HTML page with charts (and the SVG charts, and report.json) into DIR.
    #[arg(long, value_name = "DIR")]
    report: Option<PathBuf>,
}

fn main() -> ExitCode {
    match run(Cli::parse().command) {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("error: {message}");
            ExitCode::FAILURE
        }
    }
}

fn run(command: Command) -> Result<(), String> {
    match command {
        Command::Check { config } => {
            print(&check::check(&config).map_err(|e| e.to_string())?);
            Ok(())
        }
        Command::Replay {
            config,
            log,
            format,
            fields,
            compare,
            descriptors,
            domain,
            output,
        } => {
            let fields = FieldMap::parse(&fields)?;
            let map = DescriptorMap::parse(domain, &descriptors)?;
            let mut runners = vec![replay::runner(&config, &map).map_err(|e| e.to_string())?];
            if let Some(other) = &compare {
                runners.push(replay::runner(other, &map).map_err(|e| e.to_string())?);
            }
            read_log(&log, format, fields, &mut runners)?;
            let tallies: Vec<Tally> = runners.into_iter().map(|r| r.tally).collect();
            if tallies[0].lines == 0 {
                eprintln!("warning: {} has no lines", log.display());
            }
            match &tallies[..] {
                [one] => emit(
                    &output,
                    "tollgate replay",
                    &[(&name(&config), one)],
                    one.to_json(),
                ),
                [a, b] => {
                    let (a_name, b_name) =
                        (name(&config), name(compare.as_deref().expect("compared")));
                    if !output.json {
                        print(&replay::compare_text(a, b, &a_name, &b_name));
                    }
                    let json = replay::compare_json(a, b);
                    emit_quiet(
                        &output,
                        "tollgate replay --compare",
                        &[(&a_name, a), (&b_name, b)],
                        json,
                    )
                }
                _ => unreachable!("one or two configurations"),
            }
        }
        Command::Simulate {
            config,
            rules,
            traffic,
            clients,
            duration,
            seed,
            scenario,
            list_scenarios,
            output,
        } => {
            if list_scenarios {
                for s in SCENARIOS {
                    print(&format!("{:<14} {}\n", s.name, s.about));
                }
                return Ok(());
            }
            let (mut runners, traffic, clients, duration, title) = match scenario {
                Some(name) => {
                    let s = SCENARIOS.iter().find(|s| s.name == name).ok_or_else(|| {
                        let names: Vec<&str> = SCENARIOS.iter().map(|s| s.name).collect();
                        format!(
                            "no scenario {name:?}; the scenarios are {}",
                            names.join(", ")
                        )
                    })?;
                    if !output.json {
                        print(&format!("{}: {}\n\n", s.name, s.about));
                    }
                    let runners = s
                        .rules
                        .iter()
                        .map(|r| rule_runner(r))
                        .collect::<Result<_, _>>()?;
                    let traffic: Vec<String> = s.traffic.iter().map(|t| t.to_string()).collect();
                    (
                        runners,
                        traffic,
                        s.clients,
                        std::time::Duration::from_secs(s.seconds),
                        format!("tollgate simulate --scenario {}", s.name),
                    )
                }
                None => {
                    let runners =
                        match (&config, rules.is_empty()) {
                            (Some(config), _) => {
                                // No descriptors: simulated traffic is requests, not descriptors.
                                let none = DescriptorMap::default();
                                vec![replay::runner(config, &none).map_err(|e| e.to_string())?]
                            }
                            (None, false) => rules
                                .iter()
                                .map(|r| rule_runner(r))
                                .collect::<Result<_, _>>()?,
                            (None, true) => return Err(
                                "give the rules: --config FILE, --rule SETTINGS or --scenario NAME"
                                    .into(),
                            ),
                        };
                    let duration = simulate::seconds(&duration).ok_or_else(|| {
                        format!("--duration {duration:?}: expected e.g. 60s, 10m")
                    })?;
                    (
                        runners,
                        traffic,
                        clients,
                        duration,
                        "tollgate simulate".into(),
                    )
                }
            };
            let traffic = traffic
                .iter()
                .map(|t| Traffic::parse(t))
                .collect::<Result<Vec<_>, _>>()?;
            if clients == 0 || clients > 65_536 {
                return Err("--clients must be between 1 and 65536".into());
            }
            let requests: f64 = traffic
                .iter()
                .map(|t| t.expected(duration) * clients as f64)
                .sum();
            if requests > simulate::MAX_REQUESTS {
                return Err(format!(
                    "this traffic sends about {requests:.0} requests; at most {} are simulated: shorten --duration or lower the rates",
                    simulate::MAX_REQUESTS
                ));
            }
            simulate::simulate(&traffic, clients, duration, seed, &mut runners);
            let tally = side_by_side(runners);
            emit(&output, &title, &[("simulation", &tally)], tally.to_json())
        }
    }
}

/// One runner per `--rule`.
fn rule_runner(spec: &str) -> Result<Runner, String> {
    let toml = simulate::rule_toml(spec)?;
    simulate::runner(&toml).map_err(|e| format!("--rule {spec:?}: {e}"))
}

/// The tallies of runners that saw the same traffic, as one tally with every rule.
fn side_by_side(runners: Vec<Runner>) -> Tally {
    let mut tallies = runners.into_iter().map(|r| r.tally);
    let mut all = tallies.next().unwrap_or_default();
    for tally in tallies {
        all.rules.extend(tally.rules);
    }
    all
}

fn read_log(
    path: &Path,
    format: Format,
    fields: FieldMap,
    runners: &mut [Runner],
) -> Result<(), String> {
    let failed = |e: io::Error| format!("{}: {e}", path.display());
    if path == Path::new("-") {
        let mut source = log::open(format, io::stdin().lock(), fields);
        return replay::replay(&mut *source, runners).map_err(failed);
    }
    let file = File::open(path).map_err(failed)?;
    let size = file.metadata().map_err(failed)?.len();
    // A bar on a terminal only: indicatif hides it when standard error is not one.
    let bar = if io::stderr().is_terminal() {
        ProgressBar::new(size)
    } else {
        ProgressBar::hidden()
    };
    bar.set_style(
        ProgressStyle::with_template("{bar:40} {bytes}/{total_bytes} {bytes_per_sec} eta {eta}")
            .expect("a valid template"),
    );
    let input = BufReader::with_capacity(1 << 18, bar.wrap_read(file));
    let mut source = log::open(format, input, fields);
    let result = replay::replay(&mut *source, runners).map_err(failed);
    bar.finish_and_clear();
    result
}

/// The text or the JSON, and the report.
fn emit(output: &Output, title: &str, runs: &[(&str, &Tally)], json: Value) -> Result<(), String> {
    if !output.json {
        print(&runs[0].1.to_text());
    }
    emit_quiet(output, title, runs, json)
}

/// The JSON when asked, and the report.
fn emit_quiet(
    output: &Output,
    title: &str,
    runs: &[(&str, &Tally)],
    json: Value,
) -> Result<(), String> {
    if output.json {
        print(&format!(
            "{}\n",
            serde_json::to_string_pretty(&json).expect("JSON serializes")
        ));
    }
    if let Some(dir) = &output.report {
        report::write(dir, title, runs, &json).map_err(|e| format!("{}: {e}", dir.display()))?;
        if !output.json {
            print(&format!("\nreport: {}\n", dir.join("index.html").display()));
        }
    }
    Ok(())
}

fn name(path: &Path) -> String {
    path.file_name().map_or_else(
        || path.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    )
}

/// Writes to standard output; a closed pipe (`| head`) ends quietly.
fn print(text: &str) {
    let _ = io::stdout().lock().write_all(text.as_bytes());
}
