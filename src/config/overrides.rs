//! Command-line overrides (`--set key.path=value`): parsing them, setting
//! them in a config's TOML table before it is parsed, and naming the
//! closest valid key when one does not exist. The grids of `falcon ablate`
//! set their keys the same way.

/// One `--set`: a dotted key and its value.
pub type Override = (String, toml::Value);

/// Parses `KEY=VALUE`. The value is read as a TOML value (`3e-5`, `true`,
/// `"text"`, `[1, 2]`, `{ a = 1 }`); anything that is not one and does not
/// look like an attempt at one (a quote, bracket or brace first) is taken
/// as a plain string, so `model.path=Qwen/Qwen2.5-Coder-1.5B` needs no quotes.
pub fn parse_set(arg: &str) -> Result<Override, String> {
    let Some((key, raw)) = arg.split_once('=') else {
        return Err(format!(
            "--set {arg:?}: expected KEY=VALUE (e.g. train.lr=1e-5)"
        ));
    };
    let key = key.trim();
    if key.is_empty()
        || key.split('.').any(|p| {
            p.is_empty()
                || !p
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        })
    {
        return Err(format!(
            "--set {arg:?}: {key:?} is not a dotted config key (e.g. train.lr)"
        ));
    }
    let raw = raw.trim();
    let value = match toml::from_str::<toml::Table>(&format!("v = {raw}")) {
        Ok(mut t) => t.remove("v").expect("the one key"),
        Err(e) if raw.is_empty() || raw.starts_with(['"', '\'', '[', '{']) => {
            let why = e.message().trim().to_owned();
            return Err(format!("--set {arg:?}: the value is not valid TOML: {why}"));
        }
        Err(_) => toml::Value::String(raw.to_owned()),
    };
    Ok((key.to_owned(), value))
}

/// The valid name closest to `name` among `candidates` (edit distance at
/// most a third of the longer name, and at least 1 allowed), for "did you
/// mean" hints.
pub fn closest<'a>(name: &str, candidates: &[&'a str]) -> Option<&'a str> {
    candidates
        .iter()
        .map(|c| (edit_distance(name, c), *c))
        .filter(|(d, c)| *d <= (name.len().max(c.len()) / 3).max(1))
        .min_by_key(|(d, _)| *d)
        .map(|(_, c)| c)
}

/// Optimal-string-alignment distance: a swap of two neighbours (`trian`
/// for `train`) counts as one edit.
fn edit_distance(a: &str, b: &str) -> usize {
    let (a, b): (Vec<char>, Vec<char>) = (a.chars().collect(), b.chars().collect());
    let mut d = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for (i, row) in d.iter_mut().enumerate() {
        row[0] = i;
    }
    for (j, cell) in d[0].iter_mut().enumerate() {
        *cell = j;
    }
    for i in 1..=a.len() {
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            let mut v = (d[i - 1][j] + 1)
                .min(d[i][j - 1] + 1)
                .min(d[i - 1][j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                v = v.min(d[i - 2][j - 2] + 1);
            }
            d[i][j] = v;
        }
    }
    d[a.len()][b.len()]
}

/// A toml "unknown field `x`, expected one of `a`, `b`" message made into
/// one naming the closest valid key, with the `--set` key that brought `x`.
pub(super) fn explain_unknown(message: &str, set: &[Override]) -> Option<(String, String)> {
    let rest = message.split("unknown field `").nth(1)?;
    let (field, rest) = rest.split_once('`')?;
    let (key, _) = set.iter().find(|(k, _)| k.split('.').any(|p| p == field))?;
    let expected: Vec<&str> = rest.split('`').skip(1).step_by(2).collect();
    let parent: Vec<&str> = key.split('.').take_while(|p| *p != field).collect();
    let section = if parent.is_empty() {
        "the top level".to_owned()
    } else {
        format!("[{}]", parent.join("."))
    };
    let hint = match closest(field, &expected) {
        Some(c) => {
            let mut fixed = parent.clone();
            fixed.push(c);
            format!("; did you mean `{}`?", fixed.join("."))
        }
        None => format!("; valid keys there: {}", expected.join(", ")),
    };
    Some((key.clone(), format!("{section} has no key `{field}`{hint}")))
}

/// Set each dotted key of `set` in `table`, creating missing tables on the
/// way. In an array of tables (`[[reward.custom]]`) the next part of the
/// key picks the table by its `name` (`reward.custom.lint.weight`). A key
/// whose path runs through a value that is not a table is an error naming
/// both.
pub fn apply_overrides(
    table: &mut toml::Table,
    set: &[(String, toml::Value)],
) -> Result<(), String> {
    for (key, value) in set {
        let parts: Vec<&str> = key.split('.').collect();
        if parts.iter().any(|p| p.is_empty()) {
            return Err(format!("{key:?} is not a dotted config key"));
        }
        let (last, path) = parts.split_last().expect("split yields one part");
        let mut t = &mut *table;
        let mut i = 0;
        while i < path.len() {
            let p = path[i];
            let entry = t
                .entry(p.to_string())
                .or_insert_with(|| toml::Value::Table(toml::Table::new()));
            if let toml::Value::Array(items) = entry {
                if !items.iter().all(toml::Value::is_table) {
                    return Err(format!(
                        "{key}: {} is a list, not a section",
                        parts[..=i].join(".")
                    ));
                }
                let Some(&name) = path.get(i + 1) else {
                    return Err(format!(
                        "{key}: {} is a list of tables; name one: {}.NAME.key",
                        parts[..=i].join("."),
                        parts[..=i].join(".")
                    ));
                };
                let names: Vec<String> = items
                    .iter()
                    .filter_map(|v| v.get("name").and_then(|n| n.as_str()).map(str::to_owned))
                    .collect();
                i += 1;
                t = match items
                    .iter_mut()
                    .find(|v| v.get("name").and_then(|n| n.as_str()) == Some(name))
                {
                    Some(toml::Value::Table(inner)) => inner,
                    _ => {
                        return Err(format!(
                            "{key}: {} has no entry named {name:?} (it has: {})",
                            parts[..i].join("."),
                            names.join(", ")
                        ))
                    }
                };
            } else {
                t = match entry {
                    toml::Value::Table(inner) => inner,
                    other => {
                        return Err(format!(
                            "{key}: {} is {other}, not a section",
                            parts[..=i].join(".")
                        ))
                    }
                };
            }
            i += 1;
        }
        t.insert(last.to_string(), value.clone());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_toml_or_plain_strings() {
        let v = |s: &str| parse_set(s).unwrap().1;
        assert_eq!(v("train.lr=3e-5"), toml::Value::Float(3e-5));
        assert_eq!(v("train.steps=20"), toml::Value::Integer(20));
        assert_eq!(v("train.eval_after=false"), toml::Value::Boolean(false));
        assert_eq!(
            v("model.path=Qwen/Qwen2.5-Coder-1.5B"),
            "Qwen/Qwen2.5-Coder-1.5B".into()
        );
        assert_eq!(v("model.path=\"a b\""), "a b".into());
        assert_eq!(
            v("model.lora.targets=[\"q_proj\", \"v_proj\"]"),
            toml::Value::Array(vec!["q_proj".into(), "v_proj".into()])
        );
        assert_eq!(parse_set(" run.name = x ").unwrap().0, "run.name");
        for bad in [
            "train.lr",
            "=3",
            "train..lr=1",
            "train lr=1",
            "x=[1,",
            "x=\"open",
        ] {
            assert!(parse_set(bad).is_err(), "{bad} is refused");
        }
        assert!(parse_set("x=[1,").unwrap_err().contains("not valid TOML"));
    }

    #[test]
    fn the_closest_key_is_named() {
        let keys = ["lr", "steps", "warmup_steps", "weight_decay"];
        assert_eq!(closest("lrr", &keys), Some("lr"));
        assert_eq!(closest("step", &keys), Some("steps"));
        assert_eq!(closest("warmupsteps", &keys), Some("warmup_steps"));
        assert_eq!(closest("banana", &keys), None);
        let msg = "unknown field `lrr`, expected one of `lr`, `steps`, `warmup_steps`";
        let set = [("train.lrr".to_owned(), toml::Value::Float(1.0))];
        assert_eq!(
            explain_unknown(msg, &set).unwrap(),
            (
                "train.lrr".to_owned(),
                "[train] has no key `lrr`; did you mean `train.lr`?".to_owned()
            )
        );
        assert_eq!(closest("trian", &["train", "tasks"]), Some("train"));
    }
}
