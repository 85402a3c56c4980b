//! Reading what the layer recorded through `metrics`, from a `metrics-util` debugging recorder.

use metrics_util::debugging::{DebugValue, Snapshotter};

/// The value of metric `name` labelled with `rule`, if it was recorded.
pub fn of_rule(snapshotter: &Snapshotter, name: &str, rule: &str) -> Option<DebugValue> {
    snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .find_map(|(key, _, _, value)| {
            let key = key.key();
            let matches =
                key.name() == name && key.labels().any(|l| l.key() == "rule" && l.value() == rule);
            matches.then_some(value)
        })
}
