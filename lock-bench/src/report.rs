//! Result rows, the Markdown table and the JSON file.

use std::fmt::Write as _;

use serde_json::{json, Value};

use crate::stats::median;

/// How a row is judged. Ratios are `median(kit) / median(floor)`; the kit's value is its median.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Check {
    /// Reported only.
    Info,
    RatioAtMost(f64),
    RatioAtLeast(f64),
    KitAtMost(f64),
    KitAtLeast(f64),
    KitAbove(f64),
    KitBelow(f64),
    /// Every run of every side that has values equals this (correctness counts).
    AllEqual(f64),
    /// Every kit run equals this (the floor's values are shown for comparison only).
    KitAllEqual(f64),
    /// Every floor run is below this (the unlocked control must show lost updates).
    FloorAllBelow(f64),
}

/// One metric of one workload, with every run's value per side.
#[derive(Debug, Clone)]
pub(crate) struct Row {
    pub(crate) workload: String,
    pub(crate) metric: String,
    pub(crate) unit: &'static str,
    pub(crate) kit: Vec<f64>,
    pub(crate) floor: Vec<f64>,
    pub(crate) check: Check,
    target: Option<String>,
    /// Text for the floor column when the floor has no value (e.g. "deadlocks").
    floor_note: Option<&'static str>,
}

impl Row {
    pub(crate) fn new(
        workload: &str,
        metric: &str,
        unit: &'static str,
        kit: Vec<f64>,
        floor: Vec<f64>,
        check: Check,
    ) -> Self {
        Self {
            workload: workload.to_owned(),
            metric: metric.to_owned(),
            unit,
            kit,
            floor,
            check,
            target: None,
            floor_note: None,
        }
    }

    /// Replaces the generated target text.
    pub(crate) fn target(mut self, text: &str) -> Self {
        self.target = Some(text.to_owned());
        self
    }

    pub(crate) fn floor_note(mut self, note: &'static str) -> Self {
        self.floor_note = Some(note);
        self
    }

    pub(crate) fn kit_median(&self) -> f64 {
        median(&self.kit)
    }

    pub(crate) fn floor_median(&self) -> f64 {
        median(&self.floor)
    }

    /// kit/floor: the median of the per-repetition ratios when both sides ran the same number
    /// of times (each kit run is paired with the floor run right after it, so a burst of noise
    /// that hits one pair does not skew the result), else the ratio of the medians.
    pub(crate) fn ratio(&self) -> f64 {
        if !self.kit.is_empty() && self.kit.len() == self.floor.len() {
            let ratios: Vec<f64> = self
                .kit
                .iter()
                .zip(&self.floor)
                .filter(|(_, f)| **f != 0.0)
                .map(|(k, f)| k / f)
                .collect();
            return median(&ratios);
        }
        let (k, f) = (self.kit_median(), self.floor_median());
        if f == 0.0 {
            f64::NAN
        } else {
            k / f
        }
    }

    pub(crate) fn target_text(&self) -> String {
        if let Some(t) = &self.target {
            return t.clone();
        }
        let u = if self.unit.is_empty() {
            String::new()
        } else {
            format!(" {}", self.unit)
        };
        match self.check {
            Check::Info => String::new(),
            Check::RatioAtMost(x) => format!("≤ {x}x floor"),
            Check::RatioAtLeast(x) => format!("≥ {x}x floor"),
            Check::KitAtMost(x) => format!("≤ {}{u}", num(x)),
            Check::KitAtLeast(x) => format!("≥ {}{u}", num(x)),
            Check::KitAbove(x) => format!("> {}{u}", num(x)),
            Check::KitBelow(x) => format!("< {}{u}", num(x)),
            Check::AllEqual(x) => format!("= {} in every run", num(x)),
            Check::KitAllEqual(x) => format!("kit = {} in every run", num(x)),
            Check::FloorAllBelow(x) => format!("< {} (lost updates)", num(x)),
        }
    }

    /// `None` for informational rows.
    pub(crate) fn pass(&self) -> Option<bool> {
        let kit = self.kit_median();
        Some(match self.check {
            Check::Info => return None,
            Check::RatioAtMost(x) => self.ratio() <= x,
            Check::RatioAtLeast(x) => self.ratio() >= x,
            Check::KitAtMost(x) => kit <= x,
            Check::KitAtLeast(x) => kit >= x,
            Check::KitAbove(x) => kit > x,
            Check::KitBelow(x) => kit < x,
            Check::AllEqual(x) => {
                !(self.kit.is_empty() && self.floor.is_empty())
                    && self.kit.iter().chain(&self.floor).all(|v| *v == x)
            }
            Check::KitAllEqual(x) => !self.kit.is_empty() && self.kit.iter().all(|v| *v == x),
            Check::FloorAllBelow(x) => !self.floor.is_empty() && self.floor.iter().all(|v| *v < x),
        })
    }

    fn cell(&self, values: &[f64], note: Option<&str>) -> String {
        if values.is_empty() {
            return note.unwrap_or("–").to_owned();
        }
        let m = median(values);
        if self.unit.is_empty() {
            num(m)
        } else {
            format!("{} {}", num(m), self.unit)
        }
    }

    fn to_json(&self) -> Value {
        let side = |v: &[f64]| {
            if v.is_empty() {
                Value::Null
            } else {
                json!({ "median": finite(median(v)), "runs": v.iter().map(|x| finite(*x)).collect::<Vec<_>>() })
            }
        };
        json!({
            "workload": self.workload,
            "metric": self.metric,
            "unit": self.unit,
            "kit": side(&self.kit),
            "floor": side(&self.floor),
            "floor_note": self.floor_note,
            "ratio": finite(self.ratio()),
            "target": self.target_text(),
            "pass": self.pass(),
        })
    }
}

fn finite(x: f64) -> Value {
    if x.is_finite() {
        json!(x)
    } else {
        Value::Null
    }
}

/// A number for a table cell: 3 significant digits or whole numbers.
pub(crate) fn num(x: f64) -> String {
    if x.is_nan() {
        return "–".to_owned();
    }
    let a = x.abs();
    if a == 0.0 || a >= 1000.0 {
        group(x.round())
    } else if a >= 100.0 {
        format!("{x:.0}")
    } else if a >= 10.0 {
        format!("{x:.1}")
    } else if a >= 0.01 {
        format!("{x:.2}")
    } else {
        format!("{x:.4}")
    }
}

/// Whole number with thin thousands separators.
fn group(x: f64) -> String {
    let s = format!("{:.0}", x.abs());
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    if x < 0.0 {
        format!("-{out}")
    } else {
        out
    }
}

/// The results table in Markdown.
pub(crate) fn markdown(rows: &[Row]) -> String {
    let mut out = String::new();
    out.push_str("| workload | metric | kit | floor | kit/floor | target | result |\n");
    out.push_str("|---|---|---:|---:|---:|---|---|\n");
    for row in rows {
        let ratio = if row.kit.is_empty() || row.floor.is_empty() {
            "–".to_owned()
        } else {
            let r = row.ratio();
            if r.is_nan() {
                "–".to_owned()
            } else {
                format!("{r:.2}")
            }
        };
        let result = match row.pass() {
            None => "",
            Some(true) => "pass",
            Some(false) => "**miss**",
        };
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} |",
            row.workload,
            row.metric,
            row.cell(&row.kit, None),
            row.cell(&row.floor, row.floor_note),
            ratio,
            row.target_text(),
            result
        );
    }
    out
}

/// The JSON document: parameters, environment and every row with every run.
pub(crate) fn json(rows: &[Row], header: Value) -> Value {
    let mut doc = header;
    doc["rows"] = rows.iter().map(Row::to_json).collect::<Vec<_>>().into();
    let (mut passed, mut missed) = (0, 0);
    for row in rows {
        match row.pass() {
            Some(true) => passed += 1,
            Some(false) => missed += 1,
            None => {}
        }
    }
    doc["summary"] = json!({ "targets": passed + missed, "passed": passed, "missed": missed });
    doc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers() {
        assert_eq!(num(12345.6), "12,346");
        assert_eq!(num(1234.0), "1,234");
        assert_eq!(num(123.4), "123");
        assert_eq!(num(12.34), "12.3");
        assert_eq!(num(1.234), "1.23");
        assert_eq!(num(0.0), "0");
    }

    #[test]
    fn checks() {
        let row = Row::new(
            "W",
            "m",
            "",
            vec![1.0, 1.2, 1.1],
            vec![1.0, 1.0, 1.0],
            Check::RatioAtMost(1.15),
        );
        assert_eq!(row.pass(), Some(true));
        let row = Row::new(
            "W",
            "m",
            "",
            vec![3200.0, 3200.0],
            vec![3200.0, 3199.0],
            Check::AllEqual(3200.0),
        );
        assert_eq!(row.pass(), Some(false));
        assert!(markdown(&[row]).contains("**miss**"));
    }

    #[test]
    fn ratio_is_median_of_pairs() {
        // A burst of noise hit the kit in runs 1-2 and the floor in run 1: pairwise ratios are
        // 1.19, 3.08, 1.25 (median 1.25); the ratio of the medians would say 3.0.
        let row = Row::new(
            "W",
            "m",
            "",
            vec![376.0, 385.0, 135.0],
            vec![316.0, 125.0, 108.0],
            Check::RatioAtMost(1.3),
        );
        assert!((row.ratio() - 1.25).abs() < 1e-9);
        assert_eq!(row.pass(), Some(true));
        let uneven = Row::new("W", "m", "", vec![2.0], vec![1.0, 1.0, 1.0], Check::Info);
        assert_eq!(uneven.ratio(), 2.0);
    }
}
