//! ralph.toml's parse errors as sentences a user can act on. The TOML parser says where
//! (`TOML parse error at line 5, column 1` and the line) and what serde refused (`unknown field
//! `x`, expected one of …`, `invalid type: integer `-1`, expected struct Price`); this module
//! keeps the where and rewrites the what: the table the key is in (`[[agents]]` with its
//! `name`, `[prices]`, `[notify]`), the closest valid key of that table, or the valid keys when
//! none is close, a run-wide key put inside an `[[agents]]` table, and a price written as
//! something other than a table. [`price_problem`] refuses negative prices, which parse.

use std::collections::BTreeMap;

use crate::protocol::Price;

/// The table a byte offset of ralph.toml lies in: its header line (`[[agents]]`, `[notify]`,
/// `[prices."gpt-5"]`) and, for an `[[agents]]` table, its `name` when the table gives one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableAt {
    /// The header as written, trimmed (`[[agents]]`).
    pub header: String,
    /// The table's `name = "…"`, when it has one.
    pub name: Option<String>,
}

impl TableAt {
    /// `[[agents]]` (`name = "cx"`), or the header alone.
    fn describe(&self) -> String {
        match &self.name {
            Some(name) => format!("{} (name = \"{name}\")", self.header),
            None => self.header.clone(),
        }
    }

    fn is_agents(&self) -> bool {
        self.header.replace(' ', "").starts_with("[[agents")
    }
}

/// The table holding byte `offset` of `text`: the last header line (`[`…) before it, with the
/// `name` of that table (looked for from the header to the next header). `None` at the top
/// level.
pub fn table_at(text: &str, offset: usize) -> Option<TableAt> {
    let offset = offset.min(text.len());
    let before = text.get(..offset)?;
    let header_start = before
        .lines()
        .map(str::trim)
        .rev()
        .find(|l| l.starts_with('['))?
        .to_owned();
    let from = before.rfind(header_start.as_str()).unwrap_or(0);
    let name = text[from..]
        .lines()
        .skip(1)
        .take_while(|l| !l.trim_start().starts_with('['))
        .find_map(|l| {
            let (key, value) = l.split_once('=')?;
            (key.trim() == "name").then(|| value.trim().trim_matches('"').to_owned())
        });
    Some(TableAt {
        header: header_start,
        name,
    })
}

/// The parser's `message` rewritten (see the module docs); `table` is where its error lies
/// ([`table_at`]) and `top_level_keys` the keys valid at the top of ralph.toml.
pub fn explain(message: &str, table: Option<&TableAt>, top_level_keys: &[String]) -> String {
    if let Some(rewritten) = unknown_key(message, table, top_level_keys) {
        return rewritten;
    }
    if message.contains("expected struct Price") {
        return replace_last_line(
            message,
            &format!(
                "{}a model's price is a table of USD per million tokens, not a single value: write `\"gpt-5\" = {{ input = 1.25, output = 10 }}` (add `cache_read = 0.125` for cached input; optional)",
                table.map(|t| format!("in {}: ", t.describe())).unwrap_or_default()
            ),
        );
    }
    match table {
        Some(t) if !message.contains(&t.header) => replace_last_line(
            message,
            &format!("in {}: {}", t.describe(), last_line(message)),
        ),
        _ => message.to_owned(),
    }
}

/// `unknown field `x`, expected one of `a`, `b`` as a sentence naming the table and the closest
/// key, or the table's keys; `None` for another message.
fn unknown_key(
    message: &str,
    table: Option<&TableAt>,
    top_level_keys: &[String],
) -> Option<String> {
    let start = message.find("unknown field `")?;
    let rest = &message[start + "unknown field `".len()..];
    let key = &rest[..rest.find('`')?];
    let list_at = rest.find("expected one of ")?;
    let list = &rest[list_at + "expected one of ".len()..];
    let list_end = list.find('\n').unwrap_or(list.len());
    let keys: Vec<&str> = list[..list_end]
        .split(", ")
        .map(|k| k.trim_matches('`'))
        .collect();
    let best = keys
        .iter()
        .map(|k| (strsim::jaro_winkler(key, k), *k))
        .max_by(|a, b| a.0.total_cmp(&b.0));
    let place = table
        .map(|t| format!(" in {}", t.describe()))
        .unwrap_or_default();
    let in_agents = table.is_some_and(TableAt::is_agents);
    let advice = match best {
        _ if in_agents && top_level_keys.iter().any(|k| k == key) => format!(
            "`{key}` is a run-wide setting, not an agent's: put it above the first [[agents]] table (an [[agents]] table takes {})",
            keys.join(", ")
        ),
        Some((score, k)) if score > 0.8 => format!("did you mean `{k}`?"),
        _ if table.is_some() => format!("the keys of {} are {}", table.map(|t| t.header.as_str()).unwrap_or(""), keys.join(", ")),
        _ => "it is not a ralph.toml key (README.md, Configuration, lists them all)".to_owned(),
    };
    let head = &message[..start];
    let tail = &list[list_end..];
    Some(format!("{head}unknown key `{key}`{place}: {advice}{tail}"))
}

fn last_line(message: &str) -> &str {
    message.trim_end().lines().last().unwrap_or(message)
}

/// `message` with its last non-empty line replaced by `line` (the parser's own words after the
/// location and the quoted line).
fn replace_last_line(message: &str, line: &str) -> String {
    let trimmed = message.trim_end();
    match trimmed.rfind('\n') {
        Some(at) => format!("{}\n{line}\n", &trimmed[..at]),
        None => line.to_owned(),
    }
}

/// A negative or non-finite price among `prices` (`where_` names their table, e.g. `[prices]`
/// or `the [[agents]] table `cx``), as a sentence naming the model and the field.
pub fn price_problem(prices: &BTreeMap<String, Price>, where_: &str) -> Option<String> {
    for (model, price) in prices {
        let fields = [
            ("input", Some(price.input)),
            ("output", Some(price.output)),
            ("cache_read", price.cache_read),
        ];
        for (field, value) in fields {
            if let Some(v) = value.filter(|v| !v.is_finite() || *v < 0.0) {
                return Some(format!(
                    "{where_}: the price of `{model}` has `{field} = {v}`: a price is USD per million tokens, 0 or more (e.g. `\"{model}\" = {{ input = 1.25, output = 10 }}`)"
                ));
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn top() -> Vec<String> {
        ["max_iter", "timeout", "agents", "prices"]
            .map(str::to_owned)
            .to_vec()
    }

    #[test]
    fn the_table_of_an_offset_is_found_with_its_name() {
        let text = "max_iter = 3\n[[agents]]\nname = \"cx\"\nagent = \"codex\"\nagent_cmdd = 1\n[notify]\nx = 1\n";
        assert_eq!(table_at(text, 3), None);
        let at = text.find("agent_cmdd").unwrap();
        assert_eq!(
            table_at(text, at),
            Some(TableAt {
                header: "[[agents]]".into(),
                name: Some("cx".into())
            })
        );
        let at = text.find("x = 1").unwrap();
        assert_eq!(table_at(text, at).unwrap().header, "[notify]");
    }

    #[test]
    fn unknown_keys_name_their_table_and_its_keys() {
        let agents = TableAt {
            header: "[[agents]]".into(),
            name: Some("cx".into()),
        };
        let msg = "TOML parse error at line 5, column 1\n  |\n5 | agent_cmdd = 1\n  | ^^^^^\nunknown field `agent_cmdd`, expected one of `name`, `agent`, `agent_cmd`, `model`\n";
        let out = explain(msg, Some(&agents), &top());
        assert!(
            out.contains(
                "unknown key `agent_cmdd` in [[agents]] (name = \"cx\"): did you mean `agent_cmd`?"
            ),
            "{out}"
        );
        assert!(out.starts_with("TOML parse error at line 5"), "{out}");
        let msg =
            "unknown field `max_iter`, expected one of `name`, `agent`, `agent_cmd`, `max_steps`";
        let out = explain(msg, Some(&agents), &top());
        assert!(
            out.contains("`max_iter` is a run-wide setting, not an agent's: put it above the first [[agents]] table (an [[agents]] table takes name, agent, agent_cmd, max_steps)"),
            "{out}"
        );
        let msg = "unknown field `colour`, expected one of `name`, `agent`, `agent_cmd`, `model`";
        let out = explain(msg, Some(&agents), &top());
        assert!(
            out.contains("the keys of [[agents]] are name, agent, agent_cmd, model"),
            "{out}"
        );
        assert!(!out.contains("--"), "no flag is named: {out}");
    }

    #[test]
    fn a_price_that_is_no_table_or_negative_reads_as_a_sentence() {
        let prices = TableAt {
            header: "[prices]".into(),
            name: None,
        };
        let msg = "TOML parse error at line 2, column 11\n  |\n2 | \"gpt-5\" = -1\n  |           ^^\ninvalid type: integer `-1`, expected struct Price\n";
        let out = explain(msg, Some(&prices), &top());
        assert!(!out.contains("expected struct"), "{out}");
        assert!(
            out.contains("in [prices]: a model's price is a table of USD per million tokens"),
            "{out}"
        );
        assert!(out.contains("2 | \"gpt-5\" = -1"), "the line stays: {out}");
        let mut table = BTreeMap::new();
        table.insert(
            "gpt-5".to_owned(),
            Price {
                input: 1.0,
                output: -2.0,
                cache_read: None,
            },
        );
        let out = price_problem(&table, "[prices]").unwrap();
        assert!(
            out.starts_with("[prices]: the price of `gpt-5` has `output = -2`"),
            "{out}"
        );
        table.get_mut("gpt-5").unwrap().output = 2.0;
        assert_eq!(price_problem(&table, "[prices]"), None);
    }
}
