//! `--svg PATH`: a grouped bar chart of IOPS, written by hand.
//!
//! Why by hand: one chart type, a few dozen elements; a plotting crate would bring more
//! code than this file. One group of bars per workload, one bar per (export, server) in
//! a fixed colour (corofuse dark, qsd light; blue for null, orange for file, green for
//! disk, purple for disk-direct, teal for qcow2, red for qcow2-alloc, grey for the
//! device row), the value
//! printed on each bar so that small bars (1 MiB writes) stay readable, a y axis with
//! round ticks, and a legend.

use std::fmt::Write;

use super::Report;
use crate::export::{ExportKind, Server};

const BAR: f64 = 30.0;
const GAP: f64 = 36.0;
const LEFT: f64 = 78.0;
const TOP: f64 = 92.0;
const PLOT_H: f64 = 300.0;
const BOTTOM: f64 = 64.0;

fn colour(export: ExportKind, server: Server) -> &'static str {
    match (export, server) {
        (ExportKind::Null, Server::Corofuse(_)) => "#1f5fa8",
        (ExportKind::Null, Server::Qsd) => "#9ec3ea",
        (ExportKind::File, Server::Corofuse(_)) => "#d9670b",
        (ExportKind::File, Server::Qsd) => "#f7bf86",
        (ExportKind::Disk, Server::Corofuse(_)) => "#2e8b3e",
        (ExportKind::Disk, Server::Qsd) => "#a6d9ae",
        (ExportKind::DiskDirect, Server::Corofuse(_)) => "#7a3fa8",
        (ExportKind::DiskDirect, Server::Qsd) => "#cdb0e6",
        (ExportKind::DiskPt, Server::Corofuse(_)) => "#5fbf6e",
        (ExportKind::DiskDirectPt, Server::Corofuse(_)) => "#a874d3",
        (ExportKind::Qcow2, Server::Corofuse(_)) => "#0f7f80",
        (ExportKind::Qcow2, Server::Qsd) => "#97d6d6",
        (ExportKind::Qcow2Alloc, Server::Corofuse(_)) => "#a83246",
        (ExportKind::Qcow2Alloc, Server::Qsd) => "#eaa4b0",
        (ExportKind::Nbd, Server::Corofuse(_)) => "#8a6d1f",
        (ExportKind::Nbd, Server::Qsd) => "#e3cf8f",
        (ExportKind::Nbd, Server::NbdLimit) => "#555555",
        // The device row, and pairs the lab never runs.
        _ => "#888888",
    }
}

/// How opaque a series' colour is: the k-th corofuse variant of an export is paler than
/// the one before (they share the export's colour), everything else is solid.
fn opacity(series: &[(ExportKind, Server)], export: ExportKind, server: Server) -> f64 {
    let k = series
        .iter()
        .take_while(|&&s| s != (export, server))
        .filter(|(e, s)| *e == export && s.is_corofuse())
        .count();
    if server.is_corofuse() {
        [1.0, 0.72, 0.5, 0.34][k.min(3)]
    } else {
        1.0
    }
}

/// Escapes text for SVG content and attributes.
fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// "121k", "1.2k", "950".
fn short(v: f64) -> String {
    if v >= 1e6 {
        format!("{:.1}M", v / 1e6)
    } else if v >= 1e4 {
        format!("{:.0}k", v / 1e3)
    } else if v >= 1e3 {
        format!("{:.1}k", v / 1e3)
    } else {
        format!("{v:.0}")
    }
}

/// A round axis maximum and tick step (1, 2 or 5 times a power of ten) for `max`.
fn ticks(max: f64) -> (f64, f64) {
    let max = max.max(1.0);
    let raw = max / 5.0;
    let pow = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|m| m * pow)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * pow);
    ((max / step).ceil() * step, step)
}

pub fn render(r: &Report) -> String {
    // Groups in table order; series = (export, server) pairs present.
    let mut groups: Vec<(&str, String)> = Vec::new();
    let mut series: Vec<(ExportKind, Server)> = Vec::new();
    for c in &r.cells {
        if !groups.iter().any(|(w, _)| *w == c.workload) {
            groups.push((c.workload, c.label.clone()));
        }
        if !series.contains(&(c.export, c.server)) {
            series.push((c.export, c.server));
        }
    }
    let group_w = series.len() as f64 * BAR + GAP;
    let width = (LEFT + groups.len() as f64 * group_w + 24.0).max(560.0);
    let height = TOP + PLOT_H + BOTTOM;
    let max = r.cells.iter().map(|c| c.median.iops).fold(0.0, f64::max);
    let (axis_max, step) = ticks(max);
    let y = |v: f64| TOP + PLOT_H - v / axis_max * PLOT_H;

    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0}" height="{height:.0}" viewBox="0 0 {width:.0} {height:.0}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let o = &r.options;
    let trials = if o.trials > 1 {
        format!(", median of {}", o.trials)
    } else {
        String::new()
    };
    let title = format!(
        "corofuse bench: IOPS per workload ({} s per run{trials})",
        o.seconds
    );
    let sub = format!(
        "{}, O_DIRECT; kernel {}, {} CPUs",
        if o.load == "fio" {
            "fio"
        } else {
            "built-in load"
        },
        r.environment.kernel,
        r.environment.cpus
    );
    let _ = writeln!(
        s,
        r#"<text x="{LEFT}" y="24" font-size="16" font-weight="bold">{}</text>"#,
        esc(&title)
    );
    let _ = writeln!(
        s,
        r##"<text x="{LEFT}" y="42" fill="#555">{}</text>"##,
        esc(&sub)
    );
    legend(&mut s, &series);
    // Y axis: gridlines and labels.
    let mut t = 0.0;
    while t <= axis_max + step / 2.0 {
        let yy = y(t);
        let _ = writeln!(
            s,
            r##"<line x1="{LEFT}" y1="{yy:.1}" x2="{:.1}" y2="{yy:.1}" stroke="#ddd"/><text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"##,
            width - 16.0,
            LEFT - 6.0,
            yy + 4.0,
            short(t)
        );
        t += step;
    }
    let _ = writeln!(
        s,
        r#"<text transform="translate(18,{:.1}) rotate(-90)" text-anchor="middle">IOPS</text>"#,
        TOP + PLOT_H / 2.0
    );
    // Bars.
    for (gi, (workload, label)) in groups.iter().enumerate() {
        let x0 = LEFT + GAP / 2.0 + gi as f64 * group_w;
        for (si, &(export, server)) in series.iter().enumerate() {
            let Some(c) = r
                .cells
                .iter()
                .find(|c| c.workload == *workload && c.export == export && c.server == server)
            else {
                continue;
            };
            let x = x0 + si as f64 * BAR;
            let v = c.median.iops;
            let top = y(v);
            let _ = writeln!(
                s,
                r#"<rect x="{:.1}" y="{top:.1}" width="{:.1}" height="{:.1}" fill="{}" fill-opacity="{}"><title>{} {} {}: {v:.0} IOPS</title></rect>"#,
                x + 1.0,
                BAR - 2.0,
                (TOP + PLOT_H - top).max(0.0),
                colour(export, server),
                opacity(&series, export, server),
                export.name(),
                server.name(),
                esc(label)
            );
            let _ = writeln!(
                s,
                r#"<text x="{:.1}" y="{:.1}" font-size="10" text-anchor="middle">{}</text>"#,
                x + BAR / 2.0,
                top - 4.0,
                short(v)
            );
        }
        // Two-line workload label under the group.
        let cx = x0 + series.len() as f64 * BAR / 2.0;
        let (first, second) = label.split_at(
            label
                .find(" io_uring")
                .or_else(|| label.find(" psync"))
                .unwrap_or(label.len()),
        );
        for (i, line) in [first.trim(), second.trim()].iter().enumerate() {
            let _ = writeln!(
                s,
                r#"<text x="{cx:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
                TOP + PLOT_H + 18.0 + i as f64 * 15.0,
                esc(line)
            );
        }
    }
    let _ = writeln!(
        s,
        r#"<line x1="{LEFT}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="black"/>"#,
        TOP + PLOT_H,
        width - 16.0,
        TOP + PLOT_H
    );
    let _ = writeln!(
        s,
        r#"<line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{:.1}" stroke="black"/>"#,
        TOP + PLOT_H
    );
    s.push_str("</svg>\n");
    s
}

fn legend(s: &mut String, series: &[(ExportKind, Server)]) {
    let mut x = LEFT;
    for &(export, server) in series {
        let label = format!("{} {}", export.name(), server.name());
        let _ = writeln!(
            s,
            r#"<rect x="{x:.1}" y="56" width="14" height="14" fill="{}" fill-opacity="{}"/><text x="{:.1}" y="67">{}</text>"#,
            colour(export, server),
            opacity(series, export, server),
            x + 19.0,
            esc(&label)
        );
        x += 28.0 + 7.5 * label.len() as f64;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::sample;

    /// Tags balance: every `<x ...>` is closed by `</x>`, in order; `<x .../>` closes itself.
    fn balanced(svg: &str) -> Result<(), String> {
        let mut stack = Vec::new();
        let mut rest = svg;
        while let Some(open) = rest.find('<') {
            let close = rest[open..].find('>').ok_or("unclosed <")? + open;
            let tag = &rest[open + 1..close];
            let name = |t: &str| t.split([' ', '\n', '/']).next().unwrap_or("").to_string();
            if let Some(end) = tag.strip_prefix('/') {
                let top = stack.pop().ok_or(format!("</{end}> closes nothing"))?;
                if top != name(end) {
                    return Err(format!("<{top}> closed by </{end}>"));
                }
            } else if !tag.ends_with('/') && !tag.starts_with('?') {
                stack.push(name(tag));
            }
            if rest[open + 1..close].contains('<') {
                return Err("a < inside a tag".into());
            }
            rest = &rest[close + 1..];
        }
        if stack.is_empty() {
            Ok(())
        } else {
            Err(format!("unclosed: {stack:?}"))
        }
    }

    #[test]
    fn chart_is_well_formed_and_labelled() {
        for compare in [false, true] {
            let svg = render(&sample::report(compare));
            balanced(&svg).unwrap_or_else(|e| panic!("{e}\n{svg}"));
            assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
            for want in [
                "IOPS",
                "randread 4k",
                "psync qd1",
                "io_uring qd64",
                "null corofuse",
                "file corofuse",
                "120k",
                "corofuse bench",
            ] {
                assert!(svg.contains(want), "{want} missing");
            }
            assert_eq!(svg.contains("null qsd"), compare);
            let bars = svg.matches("<title>").count();
            assert_eq!(bars, if compare { 12 } else { 6 });
        }
        let variants = render(&sample::with_variants());
        assert!(
            variants.contains("null corofuse q2") && variants.contains(r#"fill-opacity="0.72""#)
        );
        let svg = render(&sample::with_storage(true));
        balanced(&svg).unwrap_or_else(|e| panic!("{e}\n{svg}"));
        for want in [
            "local no FUSE",
            "device no FUSE",
            "disk corofuse",
            "disk-direct qsd",
        ] {
            assert!(svg.contains(want), "{want} missing");
        }
        assert_eq!(svg.matches("<title>").count(), 3 * (4 * 2 + 2));
        assert!(balanced("<a><b></a></b>").is_err());
        assert!(balanced("<a>").is_err());
    }

    #[test]
    fn round_ticks() {
        assert_eq!(ticks(242_000.0), (250_000.0, 50_000.0));
        assert_eq!(ticks(12_000.0), (15_000.0, 5_000.0));
        let (max, step) = ticks(0.0);
        assert!(max > 0.0 && step > 0.0);
        assert_eq!(short(121_300.0), "121k");
        assert_eq!(short(1_530.0), "1.5k");
        assert_eq!(esc("a<b&c"), "a&lt;b&amp;c");
    }
}
