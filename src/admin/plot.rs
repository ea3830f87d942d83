//! One line chart of the dashboard's history, as inline SVG: a figure with its
//! title and unit, the lines over a time axis, and a legend that names each line
//! with its current value.
//!
//! Why SVG written here and no chart library: the page loads nothing from
//! anywhere (the admin network may have no internet, and the page's policy allows
//! no script but its own), and SVG is markup the browser draws itself. Colours and
//! sizes are SVG attributes, not `style=`, which the policy forbids.
//!
//! Why the names and values are in HTML beside the drawing: text in a scaled SVG
//! shrinks with it on a phone, and a legend of eight nodes wraps as text does.
//! Every name goes through `html`'s `Render` like any other text, in the legend
//! and in each line's `<title>` (its tooltip), so a node named `<script>` stays
//! text; the drawing itself holds only numbers and fixed words.

use std::fmt::Write as _;
use std::time::Duration;

use super::html::{html, tenths, Markup, Raw};

/// Line colours, one a series in order; told apart with colour blindness too
/// (Okabe and Ito's set, with a violet and a brown for black and yellow, which
/// vanish on a dark or a light page). A ninth series reuses the first colour,
/// dashed.
pub(super) const COLOURS: [&str; 8] = [
    "#0072b2", "#e69f00", "#009e73", "#cc79a7", "#56b4e9", "#d55e00", "#7b61ff", "#8c564b",
];

/// What a chart's values are, for its axis and its current values.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Unit {
    /// Events per second.
    PerSecond,
    /// A duration given in seconds, shown in milliseconds.
    Millis,
    /// A number of requests or people.
    Count,
    /// A share from 0 to 1, shown in per cent on a fixed 0–100 axis.
    Percent,
}

impl Unit {
    /// `value` as the axis and the legend show it.
    fn show(self, value: f64) -> String {
        match self {
            Unit::PerSecond => format!("{}/s", short(value)),
            Unit::Millis => format!("{} ms", short(value * 1000.0)),
            Unit::Count => short(value),
            Unit::Percent => format!("{:.0} %", value * 100.0),
        }
    }
}

/// A number in as few characters as reads well: `0`, `0.25`, `3.5`, `42`, `1.2k`.
fn short(value: f64) -> String {
    let (value, decimals, suffix) = match value.abs() {
        v if v >= 10_000.0 => (value / 1000.0, 0, "k"),
        v if v >= 1000.0 => (value / 1000.0, 1, "k"),
        v if v >= 10.0 => (value, 0, ""),
        v if v >= 1.0 => (value, 1, ""),
        _ => (value, 2, ""),
    };
    let mut text = format!("{value:.decimals$}");
    if text.contains('.') {
        text.truncate(text.trim_end_matches('0').trim_end_matches('.').len());
    }
    text + suffix
}

/// How long ago a point of the time axis was: `45s`, `15m`, `3h`.
fn ago(seconds: u64) -> String {
    match seconds {
        s if s < 120 => format!("{s}s"),
        s if s < 7200 => format!("{}m", s / 60),
        s => format!("{}h", s / 3600),
    }
}

/// One line: its name, and its points oldest first, the last one the newest
/// point of the chart (a shorter line starts later). `None`: no value there.
pub(super) struct Series {
    pub(super) name: String,
    pub(super) points: Vec<Option<f64>>,
    /// The legend's figure when it is not the newest point as the unit shows it
    /// (in flight against a cap: "3 / 8").
    pub(super) current: Option<String>,
}

/// A chart: an `id` for the page and its tests, a title with its unit, and the
/// time axis: `slots` points from the left edge to now, one every `every`.
pub(super) struct Chart<'a> {
    pub(super) id: &'static str,
    pub(super) title: &'static str,
    pub(super) unit: Unit,
    pub(super) slots: usize,
    pub(super) every: Duration,
    pub(super) series: &'a [Series],
    /// The value axis reaches at least this (the highest cap, for requests in
    /// flight: how full the nodes are shows at a glance).
    pub(super) at_least: f64,
}

/// The drawing's own coordinates; the browser scales them to the figure's width.
const WIDTH: f64 = 320.0;
const HEIGHT: f64 = 130.0;
const LEFT: f64 = 44.0;
const RIGHT: f64 = 8.0;
const TOP: f64 = 8.0;
const BOTTOM: f64 = 18.0;

impl Chart<'_> {
    /// The top of the value axis: 100 % for a share, else the lowest of 1, 2 or 5
    /// times a power of ten at or above every value (at least 1 of the unit).
    fn top(&self) -> f64 {
        if self.unit == Unit::Percent {
            return 1.0;
        }
        let values = self.series.iter().flat_map(|s| s.points.iter().flatten());
        let high = values
            .copied()
            .filter(|v| v.is_finite())
            .fold(0.0, f64::max);
        let floor = if self.unit == Unit::Millis {
            0.001
        } else {
            1.0
        };
        let high = high.max(floor).max(self.at_least);
        let power = 10f64.powf(high.log10().floor());
        let step = [1.0, 2.0, 5.0, 10.0]
            .into_iter()
            .find(|m| m * power >= high);
        step.unwrap_or(10.0) * power
    }

    fn x(&self, slot: usize) -> f64 {
        let width = WIDTH - LEFT - RIGHT;
        LEFT + width * slot as f64 / self.slots.saturating_sub(1).max(1) as f64
    }

    fn y(&self, value: f64, top: f64) -> f64 {
        let height = HEIGHT - TOP - BOTTOM;
        TOP + height * (1.0 - (value / top).clamp(0.0, 1.0))
    }
}

/// Writes `chart` as a `<figure>`.
pub(super) fn write(out: &mut Markup, chart: &Chart<'_>) {
    html!(
        out,
        "<figure class=\"plot\" id=\"plot-",
        chart.id,
        "\"><figcaption>",
        chart.title,
        "</figcaption><svg viewBox=\"0 0 320 130\" role=\"img\" aria-label=\"",
        chart.title,
        "\" width=\"100%\" font-size=\"10\" fill=\"currentColor\">"
    );
    let top = chart.top();
    axes(out, chart, top);
    for (n, series) in chart.series.iter().enumerate() {
        line(out, chart, n, series, top);
    }
    html!(out, "</svg><ul class=\"legend\">");
    for (n, series) in chart.series.iter().enumerate() {
        let newest = series.points.last().copied().flatten();
        let current = match (&series.current, newest) {
            (Some(current), _) => current.clone(),
            (None, Some(value)) => chart.unit.show(value),
            (None, None) => "–".into(),
        };
        html!(
            out,
            "<li><svg width=\"18\" height=\"12\" aria-hidden=\"true\"><line x1=\"1\" \
             y1=\"6\" x2=\"17\" y2=\"6\" stroke-width=\"4\" stroke=\"",
            Raw(COLOURS[n % COLOURS.len()]),
            "\"",
            Raw(dashes(n)),
            "/></svg> ",
            series.name,
            " <b data-current=\"",
            series.name,
            "\">",
            current,
            "</b></li>"
        );
    }
    html!(out, "</ul></figure>");
}

/// Three value lines with their labels, and the time labels under the plot.
fn axes(out: &mut Markup, chart: &Chart<'_>, top: f64) {
    for share in [0.0, 0.5, 1.0] {
        let y = chart.y(top * share, top);
        html!(
            out,
            "<line x1=\"44\" x2=\"312\" y1=\"",
            tenths(y),
            "\" y2=\"",
            tenths(y),
            "\" stroke=\"#8886\" stroke-width=\"0.5\"/><text x=\"40\" y=\"",
            tenths(y + 3.5),
            "\" text-anchor=\"end\">",
            chart.unit.show(top * share),
            "</text>"
        );
    }
    let span = chart.every.as_secs_f64() * chart.slots as f64;
    for quarter in 0..=4_u32 {
        let slot = chart.slots.saturating_sub(1) * quarter as usize / 4;
        let ago = span * f64::from(4 - quarter) / 4.0;
        let label = match quarter {
            4 => "now".to_owned(),
            _ => format!("−{}", self::ago(ago.round() as u64)),
        };
        let anchor = match quarter {
            0 => "start",
            4 => "end",
            _ => "middle",
        };
        html!(
            out,
            "<text x=\"",
            tenths(chart.x(slot)),
            "\" y=\"126\" text-anchor=\"",
            anchor,
            "\">",
            label,
            "</text>"
        );
    }
}

/// The dashes of the `n`th series: none for the first eight, then dashed, in the
/// chart and in its legend alike.
fn dashes(n: usize) -> &'static str {
    if n >= COLOURS.len() {
        " stroke-dasharray=\"5 3\""
    } else {
        ""
    }
}

/// One series as a path: a point per value, a gap where there is none, a dot for
/// a value with no neighbour.
fn line(out: &mut Markup, chart: &Chart<'_>, n: usize, series: &Series, top: f64) {
    let first_slot = chart.slots.saturating_sub(series.points.len());
    let mut path = String::new();
    let mut joined = false;
    for (i, value) in series.points.iter().enumerate() {
        let Some(value) = value.filter(|v| v.is_finite()) else {
            joined = false;
            continue;
        };
        let (x, y) = (chart.x(first_slot + i), chart.y(value, top));
        let step = if joined { 'L' } else { 'M' };
        let _ = write!(path, "{step}{x:.1} {y:.1}");
        let alone = !joined && series.points.get(i + 1).is_none_or(Option::is_none);
        if alone {
            path.push_str("h0");
        }
        joined = true;
    }
    if path.is_empty() {
        return;
    }
    html!(
        out,
        "<path d=\"",
        path,
        "\" fill=\"none\" stroke=\"",
        Raw(COLOURS[n % COLOURS.len()]),
        "\" stroke-width=\"1.5\" stroke-linejoin=\"round\" stroke-linecap=\"round\"",
        Raw(dashes(n)),
        "><title>",
        series.name,
        "</title></path>"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chart(series: &[Series]) -> Markup {
        let mut out = Markup::new();
        let chart = Chart {
            id: "requests",
            title: "Requests per second",
            unit: Unit::PerSecond,
            slots: 5,
            every: Duration::from_secs(10),
            series,
            at_least: 0.0,
        };
        write(&mut out, &chart);
        out
    }

    fn series(name: &str, points: &[Option<f64>]) -> Series {
        Series {
            name: name.into(),
            points: points.to_vec(),
            current: None,
        }
    }

    #[test]
    fn a_node_named_like_markup_stays_text_in_the_legend_and_the_drawing() {
        let name = "</title></path></svg><script>alert(1)</script><svg onload=alert(2)>";
        let out = chart(&[series(name, &[Some(1.0), Some(2.0)])]);
        assert!(!out.contains("<script"), "{}", &*out);
        assert!(!out.contains("<svg onload"), "{}", &*out);
        assert_eq!(out.matches("<svg").count(), 2, "the chart and one swatch");
        assert_eq!(out.matches("</svg>").count(), 2);
        assert!(out.contains("&lt;script&gt;alert(1)&lt;/script&gt;"));
    }

    #[test]
    fn a_line_is_drawn_from_its_points_right_aligned_to_now_with_gaps() {
        let out = chart(&[series("web1", &[Some(0.0), Some(4.0), None, Some(2.0)])]);
        // Five slots over 268 units from x = 44: the four points take the last four.
        assert!(
            out.contains("d=\"M111.0 112.0L178.0 28.8M312.0 70.4h0\""),
            "{}",
            &*out
        );
        assert!(out.contains("stroke=\"#0072b2\""));
        assert!(out.contains("<b data-current=\"web1\">2/s</b>"));
        // The axis is 0 to 5/s (4 rounds up to 5), and the time runs to now.
        for label in [">0/s<", ">2.5/s<", ">5/s<", ">−50s<", ">−13s<", ">now<"] {
            assert!(out.contains(label), "{label} in {}", &*out);
        }
    }

    #[test]
    fn a_line_without_values_draws_nothing_and_says_so() {
        let out = chart(&[series("web2", &[None, None])]);
        assert!(!out.contains("<path"));
        assert!(out.contains("<b data-current=\"web2\">–</b>"));
    }

    #[test]
    fn a_ninth_node_is_dashed_in_the_first_colour() {
        let all: Vec<Series> = (1..=9)
            .map(|n| series(&format!("web{n}"), &[Some(1.0), Some(1.0)]))
            .collect();
        let out = chart(&all);
        assert_eq!(
            out.matches("stroke=\"#0072b2\"").count(),
            4,
            "lines and swatches"
        );
        assert_eq!(
            out.matches("stroke-dasharray").count(),
            2,
            "the ninth's, both"
        );
    }

    #[test]
    fn values_read_short_in_their_unit() {
        let shown: Vec<String> = [
            (Unit::PerSecond, 0.0),
            (Unit::PerSecond, 0.25),
            (Unit::PerSecond, 12.0),
            (Unit::Millis, 0.2426),
            (Unit::Count, 1500.0),
            (Unit::Percent, 0.974),
        ]
        .into_iter()
        .map(|(unit, value)| unit.show(value))
        .collect();
        assert_eq!(shown, ["0/s", "0.25/s", "12/s", "243 ms", "1.5k", "97 %"]);
    }

    #[test]
    fn the_axis_top_is_a_round_number_above_every_value() {
        let top = |unit, values: &[f64], at_least| {
            let points = values.iter().map(|v| Some(*v)).collect();
            let series = [Series {
                name: "web1".into(),
                points,
                current: None,
            }];
            let chart = Chart {
                id: "t",
                title: "t",
                unit,
                slots: 3,
                every: Duration::from_secs(10),
                series: &series,
                at_least,
            };
            chart.top()
        };
        assert_eq!(top(Unit::PerSecond, &[], 0.0), 1.0);
        assert_eq!(top(Unit::PerSecond, &[0.3, 1.5], 0.0), 2.0);
        assert_eq!(top(Unit::Count, &[7.0], 0.0), 10.0);
        assert_eq!(top(Unit::Count, &[230.0], 0.0), 500.0);
        assert_eq!(top(Unit::Count, &[3.0], 8.0), 10.0, "the highest cap shows");
        assert!((top(Unit::Millis, &[0.0042], 0.0) - 0.005).abs() < 1e-12);
        assert_eq!(top(Unit::Percent, &[0.2], 0.0), 1.0);
    }
}
