//! `--svg PATH`: a grouped bar chart of IOPS, drawn with plotters' SVG backend.
//!
//! One group of bars per workload, one bar per (export, server) in a fixed colour
//! (corofuse dark, qsd light; blue for null, orange for file, green for disk, purple for
//! disk-direct, teal for qcow2, red for qcow2-alloc, grey for the device row), the value
//! printed on each bar so that small bars (1 MiB writes) stay readable, a y axis with
//! round ticks, and a legend. plotters is built with its SVG backend only: text is laid
//! out by its naive font metrics, so no font library is linked.

use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use super::Report;
use crate::export::{ExportKind, Server};

/// Pixels: a bar's width, the gap between groups, the margins around the plot, its height.
const BAR: f64 = 30.0;
const GAP: f64 = 36.0;
const LEFT: u32 = 78;
const TOP: u32 = 92;
const PLOT_H: u32 = 300;
const BOTTOM: u32 = 64;

fn colour(export: ExportKind, server: Server) -> RGBColor {
    let rgb = match (export, server) {
        (ExportKind::Null, Server::Corofuse(_)) => 0x1f5fa8,
        (ExportKind::Null, Server::Qsd) => 0x9ec3ea,
        (ExportKind::File, Server::Corofuse(_)) => 0xd9670b,
        (ExportKind::File, Server::Qsd) => 0xf7bf86,
        (ExportKind::Disk, Server::Corofuse(_)) => 0x2e8b3e,
        (ExportKind::Disk, Server::Qsd) => 0xa6d9ae,
        (ExportKind::DiskDirect, Server::Corofuse(_)) => 0x7a3fa8,
        (ExportKind::DiskDirect, Server::Qsd) => 0xcdb0e6,
        (ExportKind::DiskPt, Server::Corofuse(_)) => 0x5fbf6e,
        (ExportKind::DiskDirectPt, Server::Corofuse(_)) => 0xa874d3,
        (ExportKind::Qcow2, Server::Corofuse(_)) => 0x0f7f80,
        (ExportKind::Qcow2, Server::Qsd) => 0x97d6d6,
        (ExportKind::Qcow2Alloc, Server::Corofuse(_)) => 0xa83246,
        (ExportKind::Qcow2Alloc, Server::Qsd) => 0xeaa4b0,
        // The device row, and pairs the lab never runs.
        _ => 0x888888,
    };
    RGBColor((rgb >> 16) as u8, (rgb >> 8) as u8, rgb as u8)
}

/// A series' colour and opacity: the k-th corofuse variant of an export is paler than the
/// one before (they share the export's colour), everything else is solid.
fn fill(series: &[(ExportKind, Server)], export: ExportKind, server: Server) -> RGBAColor {
    let k = series
        .iter()
        .take_while(|&&s| s != (export, server))
        .filter(|(e, s)| *e == export && s.is_corofuse())
        .count();
    let opacity = if server.is_corofuse() {
        [1.0, 0.72, 0.5, 0.34][k.min(3)]
    } else {
        1.0
    };
    colour(export, server).mix(opacity)
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

/// Text of `px` pixels: plotters writes font sizes as 1/1.24 of the size it is given.
fn font(px: f64) -> FontDesc<'static> {
    ("sans-serif", px * 1.24).into_font()
}

pub fn render(r: &Report) -> Result<String, String> {
    let mut svg = String::new();
    draw(r, &mut svg).map_err(|e| format!("cannot draw the chart: {e}"))?;
    Ok(svg)
}

fn draw(r: &Report, svg: &mut String) -> Result<(), Box<dyn std::error::Error>> {
    // Groups in table order; series = (export, server) pairs present.
    let mut groups: Vec<(&str, &str)> = Vec::new();
    let mut series: Vec<(ExportKind, Server)> = Vec::new();
    for c in &r.cells {
        if !groups.iter().any(|(w, _)| *w == c.workload) {
            groups.push((c.workload, &c.label));
        }
        if !series.contains(&(c.export, c.server)) {
            series.push((c.export, c.server));
        }
    }
    let group_w = series.len() as f64 * BAR + GAP;
    let width = (LEFT as f64 + groups.len() as f64 * group_w + 24.0).max(560.0) as u32;
    let root = SVGBackend::with_string(svg, (width, TOP + PLOT_H + BOTTOM)).into_drawing_area();
    root.fill(&WHITE)?;
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
    let load = if o.load == "fio" {
        "fio"
    } else {
        "built-in load"
    };
    let (e, left) = (&r.environment, LEFT as i32);
    let sub = format!("{load}, O_DIRECT; kernel {}, {} CPUs", e.kernel, e.cpus);
    root.draw_text(
        &title,
        &font(16.0).style(FontStyle::Bold).color(&BLACK),
        (left, 10),
    )?;
    root.draw_text(
        &sub,
        &font(12.0).color(&RGBColor(0x55, 0x55, 0x55)),
        (left, 30),
    )?;
    // The legend: one swatch and name per series, in a row.
    let mut x = left;
    for &(export, server) in &series {
        let name = format!("{} {}", export.name(), server.name());
        let swatch = [(x, 56), (x + 14, 70)];
        root.draw(&Rectangle::new(
            swatch,
            fill(&series, export, server).filled(),
        ))?;
        root.draw_text(&name, &font(12.0).color(&BLACK), (x + 19, 57))?;
        x += 28 + (7.5 * name.len() as f64) as i32;
    }
    // The plot, in groups along x (one unit a group) and IOPS up y.
    let max = r.cells.iter().map(|c| c.median.iops).fold(0.0, f64::max);
    let (axis_max, step) = ticks(max);
    let x_max = f64::from(width - LEFT - 16) / group_w;
    let mut chart = ChartBuilder::on(&root)
        .margin_top(TOP)
        .margin_right(16)
        .x_label_area_size(BOTTOM)
        .y_label_area_size(LEFT)
        .build_cartesian_2d(0.0..x_max, 0.0..axis_max)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(0)
        .y_labels((axis_max / step).round() as usize + 1)
        .y_label_formatter(&|v| short(*v))
        .y_label_style(font(12.0))
        .y_desc("IOPS")
        .axis_desc_style(font(12.0))
        .bold_line_style(RGBColor(0xdd, 0xdd, 0xdd))
        .light_line_style(TRANSPARENT)
        .draw()?;
    let at = |gi: usize, px: f64| gi as f64 + px / group_w;
    let centred = |px, v| font(px).color(&BLACK).pos(Pos::new(HPos::Center, v));
    for (gi, &(workload, label)) in groups.iter().enumerate() {
        for (si, &(export, server)) in series.iter().enumerate() {
            let Some(c) = r
                .cells
                .iter()
                .find(|c| c.workload == workload && c.export == export && c.server == server)
            else {
                continue;
            };
            let (x0, v) = (GAP / 2.0 + si as f64 * BAR, c.median.iops);
            let bar = [(at(gi, x0 + 1.0), 0.0), (at(gi, x0 + BAR - 1.0), v)];
            let value = EmptyElement::at((at(gi, x0 + BAR / 2.0), v))
                + Text::new(short(v), (0, -4), centred(10.0, VPos::Bottom));
            chart
                .plotting_area()
                .draw(&Rectangle::new(bar, fill(&series, export, server).filled()))?;
            chart.plotting_area().draw(&value)?;
        }
        // Two-line workload label under the group.
        let split = label.find(" io_uring").or_else(|| label.find(" psync"));
        let (first, second) = label.split_at(split.unwrap_or(label.len()));
        let under = EmptyElement::at((at(gi, GAP / 2.0 + series.len() as f64 * BAR / 2.0), 0.0))
            + Text::new(first.trim().to_string(), (0, 8), centred(12.0, VPos::Top))
            + Text::new(second.trim().to_string(), (0, 23), centred(12.0, VPos::Top));
        chart.plotting_area().draw(&under)?;
    }
    root.present()?;
    Ok(())
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

    fn render(r: &Report) -> String {
        super::render(r).expect("draws")
    }

    /// Bars: the rectangles but the background and the legend's swatches (one a series).
    fn bars(svg: &str, series: usize) -> usize {
        svg.matches("<rect").count() - 1 - series
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
            let series = if compare { 4 } else { 2 };
            assert_eq!(bars(&svg, series), 3 * series);
        }
        let variants = render(&sample::with_variants());
        assert!(variants.contains("null corofuse q2") && variants.contains(r#"opacity="0.72""#));
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
        assert_eq!(bars(&svg, 4 * 2 + 2), 3 * (4 * 2 + 2));
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
    }
}
