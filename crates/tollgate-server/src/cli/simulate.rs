//! `tollgate simulate`: runs a traffic pattern through chosen algorithms under one limit, on a
//! manual clock (no waiting), and reports what each admitted: a table of the most admitted in
//! any window of length T and the delay a shaper added, and a chart (PNG or SVG): one panel
//! per algorithm, offered and admitted requests counted over the last T at every moment, and
//! the limit (see [`chart`]).

use std::fmt::Write as _;
use std::path::Path;
use std::time::Duration;

use plotters::prelude::*;
use tollgate::{Limiter, ManualClock, Rule, Tier};

use std::process::ExitCode;

use crate::config::{parse_algorithm, parse_duration};

/// A traffic pattern.
#[derive(Debug, Clone, PartialEq)]
pub enum Pattern {
    /// `rate` requests per second, evenly spaced.
    Uniform,
    /// Twice the limit at once at the start of every period, nothing between.
    Burst,
    /// The limit in the last second of the first window and again in the first second of the
    /// next: the fixed window's edge.
    Edge,
    /// From 0 to `rate` requests per second over the duration, evenly.
    Ramp,
    /// Arrival times read from a file: one per line, seconds from the start.
    Replay(Vec<f64>),
}

impl Pattern {
    /// Parses `uniform`, `burst`, `edge`, `ramp` or `file:PATH`.
    ///
    /// # Errors
    /// An unknown name, or a file that cannot be read or holds something else than seconds.
    pub fn parse(text: &str) -> Result<Self, String> {
        Ok(match text {
            "uniform" => Self::Uniform,
            "burst" => Self::Burst,
            "edge" => Self::Edge,
            "ramp" => Self::Ramp,
            _ => {
                let Some(path) = text.strip_prefix("file:") else {
                    return Err(format!(
                        "unknown pattern `{text}`: expected uniform, burst, edge, ramp or file:PATH"
                    ));
                };
                let content = std::fs::read_to_string(path)
                    .map_err(|e| format!("cannot read {path}: {e}"))?;
                let mut times = Vec::new();
                for (n, line) in content.lines().enumerate() {
                    let line = line.trim();
                    if line.is_empty() || line.starts_with('#') {
                        continue;
                    }
                    let t: f64 = line
                        .parse()
                        .ok()
                        .filter(|t: &f64| *t >= 0.0 && t.is_finite())
                        .ok_or_else(|| {
                            format!("{path}:{}: `{line}` is not a time in seconds", n + 1)
                        })?;
                    times.push(t);
                }
                times.sort_by(f64::total_cmp);
                Self::Replay(times)
            }
        })
    }

    /// Arrival times (µs from the start) over `duration`, for a limit of `limit` per `period`
    /// and a rate of `rate` per second.
    pub fn arrivals(
        &self,
        limit: u64,
        period: Duration,
        rate: f64,
        duration: Duration,
    ) -> Vec<u64> {
        let end = duration.as_micros() as u64;
        let period = period.as_micros() as u64;
        match self {
            Self::Uniform => {
                let gap = (1e6 / rate.max(1e-9)) as u64;
                (0..)
                    .map(|i| i * gap.max(1))
                    .take_while(|&t| t < end)
                    .collect()
            }
            Self::Burst => (0..)
                .map(|w| w * period)
                .take_while(|&t| t < end)
                .flat_map(|t| std::iter::repeat_n(t, 2 * limit as usize))
                .collect(),
            Self::Edge => {
                let spread =
                    |from: u64| (0..limit).map(move |i| from + i * 1_000_000 / limit.max(1));
                spread(period.saturating_sub(1_000_000))
                    .chain(spread(period))
                    .filter(|&t| t < end)
                    .collect()
            }
            Self::Ramp => {
                // Rate grows linearly: n(t) = rate t^2 / (2 D); the i-th arrival at
                // t = sqrt(2 D i / rate).
                let d = duration.as_secs_f64();
                (1..)
                    .map(|i| ((2.0 * d * i as f64 / rate.max(1e-9)).sqrt() * 1e6) as u64)
                    .take_while(|&t| t < end)
                    .collect()
            }
            Self::Replay(times) => times
                .iter()
                .map(|t| (t * 1e6) as u64)
                .filter(|&t| t < end)
                .collect(),
        }
    }
}

/// What one algorithm did with the pattern.
#[derive(Debug, Clone)]
pub struct Run {
    /// The algorithm as named.
    pub algorithm: String,
    /// When each admitted request went on (µs from the start: its arrival plus any delay).
    pub admitted: Vec<u64>,
    /// The longest delay a shaper added (µs).
    pub max_delay: u64,
}

/// The start of the simulated time: an aligned epoch, so windows start at 0.
const EPOCH: u64 = 1_700_006_400_000_000;

/// Runs `arrivals` through each algorithm under `limit` per `period` (a shaper may delay a
/// request by up to `max_delay`).
///
/// # Errors
/// An unknown algorithm or an invalid limit.
pub fn run(
    algorithms: &[String],
    limit: u64,
    period: Duration,
    arrivals: &[u64],
    max_delay: Duration,
) -> Result<Vec<Run>, String> {
    algorithms
        .iter()
        .map(|name| {
            let algorithm = parse_algorithm(name)?;
            let rule = Rule::new("simulated", algorithm, [Tier::new(limit, period)])
                .map_err(|e| e.to_string())?;
            let clock = ManualClock::new();
            let limiter = Limiter::builder(rule)
                .clock(clock.clone())
                .build()
                .map_err(|e| e.to_string())?;
            let (mut admitted, mut max) = (Vec::new(), 0);
            for &t in arrivals {
                clock.set_micros(EPOCH + t);
                let decision = limiter
                    .reserve_now("client", 1, max_delay)
                    .map_err(|e| e.to_string())?;
                if decision.allowed() {
                    let delay = decision.delay().as_micros() as u64;
                    max = max.max(delay);
                    admitted.push(t + delay);
                }
            }
            admitted.sort_unstable();
            Ok(Run {
                algorithm: name.clone(),
                admitted,
                max_delay: max,
            })
        })
        .collect()
}

/// The most of `times` (sorted, µs) in any window of `window` µs.
pub fn most_in_any_window(times: &[u64], window: u64) -> usize {
    let mut start = 0;
    let mut most = 0;
    for (end, &t) in times.iter().enumerate() {
        while times[start] + window <= t {
            start += 1;
        }
        most = most.max(end + 1 - start);
    }
    most
}

/// The table: per algorithm, offered, admitted, the most admitted in any window of `window`,
/// and the longest delay added.
pub fn table(runs: &[Run], offered: usize, limit: u64, window: Duration) -> String {
    let w = window.as_micros() as u64;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "| algorithm | offered | admitted | most in any {} s | vs limit {limit} | longest delay |",
        window.as_secs_f64()
    );
    let _ = writeln!(out, "| --- | ---: | ---: | ---: | ---: | ---: |");
    for r in runs {
        let most = most_in_any_window(&r.admitted, w);
        let _ = writeln!(
            out,
            "| {} | {offered} | {} | {most} | {:.2}x | {:.3} s |",
            r.algorithm,
            r.admitted.len(),
            most as f64 / limit as f64,
            r.max_delay as f64 / 1e6
        );
    }
    out
}

const FONT: &[u8] = include_bytes!("../../assets/DejaVuSans.ttf");

/// Draws the chart of a simulation to `path` (PNG or SVG, by its extension): one panel per
/// algorithm, each with what was offered (grey) and what it admitted (its colour), counted
/// over the last `window` at every moment, the limit drawn across (dashed), and the most
/// admitted in any window in the panel's title, the figure the table reports. So a fixed
/// window's 200 in a window of a 100 limit shows as a plateau twice the limit line, however
/// short the spike.
///
/// # Errors
/// An extension other than `.png` and `.svg`, or a file that cannot be written.
pub fn chart(
    path: &Path,
    arrivals: &[u64],
    runs: &[Run],
    duration: Duration,
    window: Duration,
    limit: u64,
    title: &str,
) -> Result<(), String> {
    let _ = plotters::style::register_font("sans-serif", FontStyle::Normal, FONT);
    let rows = runs.len().div_ceil(COLUMNS).max(1) as u32;
    let size = (1000, 120 + 260 * rows);
    let plot = Plot {
        arrivals,
        runs,
        duration,
        window,
        limit,
        title,
    };
    match path.extension().and_then(|e| e.to_str()) {
        Some("png") => plot.draw(BitMapBackend::new(path, size).into_drawing_area()),
        Some("svg") => plot.draw(SVGBackend::new(path, size).into_drawing_area()),
        _ => Err(format!(
            "{}: the chart must be a .png or .svg file",
            path.display()
        )),
    }
}

/// Panels per row.
const COLUMNS: usize = 2;

/// Samples per panel.
const SAMPLES: u64 = 600;

/// What a chart shows.
struct Plot<'a> {
    arrivals: &'a [u64],
    runs: &'a [Run],
    duration: Duration,
    window: Duration,
    limit: u64,
    title: &'a str,
}

/// How many of the sorted `times` (µs) fall in the `window` (µs) ending at each of
/// [`SAMPLES`] moments over `duration` (µs): (seconds, count).
fn rolling(times: &[u64], window: u64, duration: u64) -> Vec<(f64, f64)> {
    let step = (duration / SAMPLES).max(1);
    let (mut first, mut last) = (0, 0);
    (0..=SAMPLES)
        .map(|i| {
            let at = i * step;
            while last < times.len() && times[last] <= at {
                last += 1;
            }
            while first < last && times[first] + window <= at {
                first += 1;
            }
            (at as f64 / 1e6, (last - first) as f64)
        })
        .collect()
}

impl Plot<'_> {
    fn draw<DB: DrawingBackend>(
        &self,
        area: DrawingArea<DB, plotters::coord::Shift>,
    ) -> Result<(), String> {
        let err = |e: &dyn std::fmt::Display| e.to_string();
        area.fill(&WHITE).map_err(|e| err(&e))?;
        let area = area
            .titled(self.title, ("sans-serif", 24))
            .map_err(|e| err(&e))?;
        let (key, panels) = area.split_vertically(36);
        let window_text = format!("{:?}", self.window);
        key.draw_text(
            &format!(
                "Counted over the last {window_text} at every moment: offered (grey), admitted \
                 (colour), the limit of {} (dashed red)",
                self.limit
            ),
            &("sans-serif", 15).into_text_style(&key),
            (12, 8),
        )
        .map_err(|e| err(&e))?;
        let (duration, window) = (
            self.duration.as_micros() as u64,
            self.window.as_micros().max(1) as u64,
        );
        let offered = rolling(self.arrivals, window, duration);
        let rows = self.runs.len().div_ceil(COLUMNS).max(1);
        let cells = panels.split_evenly((rows, COLUMNS));
        let peak = offered
            .iter()
            .map(|p| p.1)
            .fold(self.limit as f64, f64::max);
        for (i, (run, cell)) in self.runs.iter().zip(cells).enumerate() {
            let admitted = rolling(&run.admitted, window, duration);
            let most = most_in_any_window(&run.admitted, window);
            let caption = format!("{}: at most {most} in any {window_text}", run.algorithm);
            let mut chart = ChartBuilder::on(&cell)
                .caption(caption, ("sans-serif", 17))
                .margin(10)
                .x_label_area_size(30)
                .y_label_area_size(48)
                .build_cartesian_2d(0.0..self.duration.as_secs_f64(), 0.0..peak * 1.15)
                .map_err(|e| err(&e))?;
            chart
                .configure_mesh()
                .x_desc("time (s)")
                .y_label_formatter(&|v| format!("{v:.0}"))
                .x_label_formatter(&|v| format!("{v:.0}"))
                .label_style(("sans-serif", 13))
                .draw()
                .map_err(|e| err(&e))?;
            let grey = RGBColor(150, 150, 150);
            chart
                .draw_series(LineSeries::new(offered.clone(), grey.stroke_width(2)))
                .map_err(|e| err(&e))?;
            let color = Palette99::pick(i).to_rgba();
            chart
                .draw_series(LineSeries::new(admitted, color.stroke_width(3)))
                .map_err(|e| err(&e))?;
            let limit = self.limit as f64;
            let across = [(0.0, limit), (self.duration.as_secs_f64(), limit)];
            chart
                .draw_series(DashedLineSeries::new(across, 8, 6, RED.stroke_width(2)))
                .map_err(|e| err(&e))?;
        }
        panels.present().map_err(|e| err(&e))
    }
}

#[allow(clippy::too_many_arguments)]
pub(super) fn command(
    pattern: &str,
    algorithms: &[String],
    limit: u64,
    period: &str,
    rate: f64,
    duration: &str,
    window: Option<&str>,
    max_delay: &str,
    to: Option<&std::path::Path>,
) -> anyhow::Result<ExitCode> {
    // A chart that cannot be drawn is said before the run, not after its table.
    if let Some(path) = to
        && !matches!(
            path.extension().and_then(|e| e.to_str()),
            Some("png" | "svg")
        )
    {
        anyhow::bail!("{}: the chart must be a .png or .svg file", path.display());
    }
    let period = parse_duration(period).map_err(anyhow::Error::msg)?;
    let duration = parse_duration(duration).map_err(anyhow::Error::msg)?;
    let window = match window {
        Some(w) => parse_duration(w).map_err(anyhow::Error::msg)?,
        None => period,
    };
    let max_delay = parse_duration(max_delay).map_err(anyhow::Error::msg)?;
    let pattern_name = pattern;
    let pattern = Pattern::parse(pattern).map_err(anyhow::Error::msg)?;
    let arrivals = pattern.arrivals(limit, period, rate, duration);
    let runs = run(algorithms, limit, period, &arrivals, max_delay).map_err(anyhow::Error::msg)?;
    print!("{}", table(&runs, arrivals.len(), limit, window));
    if let Some(path) = to {
        let title = format!(
            "{pattern_name} traffic, {} requests, against {limit} per {period:?}",
            arrivals.len()
        );
        chart(path, &arrivals, &runs, duration, window, limit, &title)
            .map_err(anyhow::Error::msg)?;
        println!("chart: {}", path.display());
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn most_in_any_window_slides() {
        assert_eq!(most_in_any_window(&[0, 1, 2, 10, 11], 3), 3);
        assert_eq!(most_in_any_window(&[0, 5, 10], 5), 1);
        assert_eq!(most_in_any_window(&[], 5), 0);
    }
}
