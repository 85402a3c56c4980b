//! `--report DIR`: one self-contained HTML page (no script, no network), per rule a chart of
//! offered, admitted and denied requests over time and its top keys; each chart also as an SVG
//! file beside the page, and the `--json` output as `report.json`.
//!
//! The charts are written by hand rather than with a plotting crate: each is three polylines, two
//! axes and a few labels — about a hundred lines — where plotters (even with only its SVG
//! backend) would bring a dozen crates to build for it.

use std::fmt::Write as _;
use std::io;
use std::path::Path;

use serde_json::Value;

use crate::stats::{Input, RuleTally, Tally, TOP_KEYS};
use crate::time::format_utc;

/// The most points a chart draws; longer logs are summed into wider buckets.
const POINTS: u64 = 120;
const WIDTH: f64 = 720.0;
const HEIGHT: f64 = 240.0;
const LEFT: f64 = 56.0;
const BOTTOM: f64 = 28.0;
const TOP: f64 = 24.0;
const RIGHT: f64 = 24.0;

/// Writes the page, the charts and `report.json` into `dir` (created if needed).
pub fn write(dir: &Path, title: &str, runs: &[(&str, &Tally)], json: &Value) -> io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let seconds = runs
        .iter()
        .flat_map(|(_, t)| t.rules.iter())
        .flat_map(|r| r.timeline.iter().map(|(s, _)| *s));
    let (first, last) = seconds.fold((u64::MAX, 0), |(lo, hi), s| (lo.min(s), hi.max(s)));
    let axis = Axis::new(first, last);
    let mut page = String::new();
    let _ = write!(
        page,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{}</title><style>{STYLE}</style></head><body>\n<h1>{}</h1>\n",
        escape(title),
        escape(title)
    );
    if let Some(axis) = &axis {
        let _ = writeln!(
            page,
            "<p>From {} to {}; each point of a chart sums {} s.</p>",
            format_utc(axis.first),
            format_utc(axis.first + axis.buckets * axis.width),
            axis.width
        );
    }
    for (run, tally) in runs {
        if runs.len() > 1 {
            let _ = writeln!(page, "<h2>{}</h2>", escape(run));
        }
        let _ = match tally.input {
            Input::Log => {
                let skipped: u64 = tally.skipped.values().sum();
                writeln!(
                    page,
                    "<p><span data-field=\"lines\">{}</span> lines, <span data-field=\"skipped\">{skipped}</span> skipped.</p>",
                    tally.lines
                )
            }
            Input::Synthetic => writeln!(
                page,
                "<p><span data-field=\"requests\">{}</span> requests sent.</p>",
                tally.lines
            ),
        };
        let _ = writeln!(page, "<table class=\"rules\"><tr><th>rule</th><th>requests</th><th>allowed</th><th>denied</th><th>delayed</th><th>refused</th><th>keys</th><th>keys limited</th></tr>");
        for rule in &tally.rules {
            let _ = write!(
                page,
                "<tr data-rule=\"{}\"><td>{}</td>",
                escape(&rule.name),
                escape(&rule.name)
            );
            for (field, value) in [
                ("requests", rule.requests),
                ("allowed", rule.allowed),
                ("denied", rule.denied),
                ("delayed", rule.delayed),
                ("refused", rule.refused),
                ("keys", rule.keys.len() as u64),
                ("keys_limited", rule.keys_limited() as u64),
            ] {
                let _ = write!(page, "<td data-field=\"{field}\">{value}</td>");
            }
            page.push_str("</tr>\n");
        }
        page.push_str("</table>\n");
        for rule in &tally.rules {
            let _ = writeln!(page, "<section><h3>{}</h3>", escape(&rule.name));
            if let Some(axis) = &axis {
                let svg = chart(axis, rule);
                let file = format!("{}.svg", file_name(&format!("{run}-{}", rule.name)));
                std::fs::write(dir.join(&file), &svg)?;
                let _ = writeln!(
                    page,
                    "<figure>{svg}<figcaption><a href=\"{file}\">{file}</a></figcaption></figure>"
                );
            }
            let top = rule.top_keys(TOP_KEYS);
            if top.is_empty() {
                page.push_str("<p>No key was denied.</p>\n");
            } else {
                page.push_str(
                    "<table class=\"keys\"><tr><th>key denied most</th><th>denied</th></tr>\n",
                );
                for (key, denied) in top {
                    let _ = writeln!(page, "<tr class=\"top-key\"><td>{}</td><td data-field=\"denied\">{denied}</td></tr>", escape(&key));
                }
                page.push_str("</table>\n");
            }
            page.push_str("</section>\n");
        }
    }
    // `--compare`: per rule, the keys one configuration's rule limits and the other's does not.
    let compared = json
        .get("rules")
        .and_then(Value::as_array)
        .filter(|_| runs.len() == 2);
    if let Some(rules) = compared {
        page.push_str("<h2>Keys limited by one configuration only, rule by rule</h2>\n");
        for rule in rules {
            let name = rule["name"].as_str().unwrap_or_default();
            let _ = writeln!(
                page,
                "<section class=\"only\" data-rule=\"{}\"><h3>{}</h3>",
                escape(name),
                escape(name)
            );
            for (side, (run, _)) in ["limited_only_by_a", "limited_only_by_b"].iter().zip(runs) {
                let only = &rule[*side];
                if only.is_null() {
                    let _ = writeln!(page, "<p>No such rule in {}.</p>", escape(run));
                    continue;
                }
                let _ = writeln!(
                    page,
                    "<p>Keys limited only by {}: <span data-field=\"{side}\">{}</span>, <span data-field=\"{side}_denied\">{}</span> requests denied.</p>",
                    escape(run),
                    only["count"],
                    only["denied"]
                );
                let keys = only["keys"].as_array().into_iter().flatten();
                let rows: Vec<String> = keys
                    .map(|k| {
                        format!(
                            "<tr class=\"only-key\"><td>{}</td><td data-field=\"denied\">{}</td></tr>",
                            escape(k["key"].as_str().unwrap_or_default()),
                            k["denied"]
                        )
                    })
                    .collect();
                if !rows.is_empty() {
                    let _ = writeln!(
                        page,
                        "<table class=\"keys\"><tr><th>key denied most</th><th>denied</th></tr>\n{}\n</table>",
                        rows.join("\n")
                    );
                }
            }
            page.push_str("</section>\n");
        }
    }
    page.push_str("</body></html>\n");
    std::fs::write(dir.join("index.html"), page)?;
    std::fs::write(
        dir.join("report.json"),
        serde_json::to_string_pretty(json)? + "\n",
    )
}

/// The common time axis of a report.
struct Axis {
    first: u64,
    /// Seconds per point.
    width: u64,
    buckets: u64,
}

impl Axis {
    fn new(first: u64, last: u64) -> Option<Axis> {
        if first > last {
            return None;
        }
        let span = last - first + 1;
        let width = span.div_ceil(POINTS);
        Some(Axis {
            first,
            width,
            buckets: span.div_ceil(width),
        })
    }
}

/// Offered, admitted and denied per bucket.
fn series(axis: &Axis, rule: &RuleTally) -> [Vec<u64>; 3] {
    let mut series = [(); 3].map(|_| vec![0; axis.buckets as usize]);
    for (second, counts) in &rule.timeline {
        let bucket = ((second - axis.first) / axis.width) as usize;
        for (line, count) in series.iter_mut().zip(counts) {
            line[bucket] += count;
        }
    }
    series
}

fn chart(axis: &Axis, rule: &RuleTally) -> String {
    let [offered, admitted, denied] = series(axis, rule);
    let max = offered.iter().copied().max().unwrap_or(0).max(1);
    let (plot_w, plot_h) = (WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM);
    let x = |i: usize| LEFT + plot_w * (i as f64 + 0.5) / axis.buckets as f64;
    let y = |v: u64| TOP + plot_h * (1.0 - v as f64 / max as f64);
    let mut svg = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" viewBox=\"0 0 {WIDTH} {HEIGHT}\" width=\"{WIDTH}\" height=\"{HEIGHT}\" font-family=\"sans-serif\" font-size=\"11\" role=\"img\" aria-label=\"{}: offered, admitted and denied requests over time\">\n",
        escape(&rule.name)
    );
    let _ = writeln!(svg, "<rect x=\"{LEFT}\" y=\"{TOP}\" width=\"{plot_w}\" height=\"{plot_h}\" fill=\"#fafafa\" stroke=\"#ccc\"/>");
    for step in 0..=4u64 {
        let value = max * step / 4;
        let _ = writeln!(
            svg,
            "<text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\" fill=\"#555\">{value}</text>",
            LEFT - 6.0,
            y(value) + 4.0
        );
        let _ = writeln!(
            svg,
            "<line x1=\"{LEFT}\" x2=\"{:.1}\" y1=\"{:.1}\" y2=\"{:.1}\" stroke=\"#e4e4e4\"/>",
            LEFT + plot_w,
            y(value),
            y(value)
        );
    }
    let span = axis.buckets * axis.width;
    for step in 0..=4u64 {
        let seconds = span * step / 4;
        let at = LEFT + plot_w * step as f64 / 4.0;
        let _ = writeln!(
            svg,
            "<text x=\"{at:.1}\" y=\"{}\" text-anchor=\"middle\" fill=\"#555\">+{}</text>",
            HEIGHT - 8.0,
            crate::check::duration(std::time::Duration::from_secs(seconds))
        );
    }
    for (name, color, values) in [
        ("offered", "#888888", &offered),
        ("admitted", "#2e7d32", &admitted),
        ("denied", "#c62828", &denied),
    ] {
        let points: Vec<String> = values
            .iter()
            .enumerate()
            .map(|(i, v)| format!("{:.1},{:.1}", x(i), y(*v)))
            .collect();
        let data: Vec<String> = values.iter().map(u64::to_string).collect();
        let _ = writeln!(
            svg,
            "<polyline data-series=\"{name}\" data-values=\"{}\" fill=\"none\" stroke=\"{color}\" stroke-width=\"1.6\" points=\"{}\"/>",
            data.join(" "),
            points.join(" ")
        );
    }
    for (i, (name, color)) in [
        ("offered", "#888888"),
        ("admitted", "#2e7d32"),
        ("denied", "#c62828"),
    ]
    .iter()
    .enumerate()
    {
        let at = LEFT + 90.0 * i as f64;
        let _ = writeln!(svg, "<rect x=\"{at}\" y=\"{}\" width=\"12\" height=\"3\" fill=\"{color}\"/><text x=\"{}\" y=\"{}\">{name}</text>", TOP - 13.0, at + 16.0, TOP - 9.0);
    }
    svg.push_str("</svg>\n");
    svg
}

/// A name safe as a file name.
fn file_name(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

const STYLE: &str = "body{font-family:sans-serif;max-width:780px;margin:1.5em auto;color:#222}\
table{border-collapse:collapse;margin:.6em 0}td,th{border:1px solid #ddd;padding:3px 8px;text-align:right}\
td:first-child,th:first-child{text-align:left}figure{margin:.5em 0}figcaption{font-size:80%;color:#666}\
h3{margin-bottom:.2em}";
