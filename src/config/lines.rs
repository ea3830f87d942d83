//! Where each key of the file is written. The walk reports a bad value on its own
//! line as it reads it; the rules `check` judges afterwards, on the whole config
//! (`refusals`), find their lines here, so an admin sees every problem of a file
//! in one list ordered by line, whichever pass found it.

use toml::de::{DeTable, DeValue};

use super::{error, line_of, ConfigError};

/// Every dotted key of the file with the line it is written on: `session.store`,
/// `session` (the `[session]` header), `nodes[1].url`. A config has a few dozen
/// keys, so a list searched front to back is all it needs.
#[derive(Debug, Clone, Default)]
pub(super) struct KeyLines(Vec<(String, usize)>);

impl KeyLines {
    /// The keys of `doc`, whose spans point into `text`.
    pub(super) fn of(doc: &DeTable, text: &str) -> KeyLines {
        let mut lines = KeyLines::default();
        lines.walk("", doc, text);
        lines
    }

    fn walk(&mut self, prefix: &str, table: &DeTable, text: &str) {
        for (name, value) in table.iter() {
            let key = match prefix {
                "" => name.get_ref().to_string(),
                _ => format!("{prefix}.{}", name.get_ref()),
            };
            self.0.push((key.clone(), line_of(text, name.span().start)));
            match value.get_ref() {
                DeValue::Table(inner) => self.walk(&key, inner, text),
                DeValue::Array(items) => {
                    for (i, item) in items.iter().enumerate() {
                        if let DeValue::Table(inner) = item.get_ref() {
                            let key = format!("{key}[{i}]");
                            self.0.push((key.clone(), line_of(text, item.span().start)));
                            self.walk(&key, inner, text);
                        }
                    }
                }
                _ => {}
            }
        }
    }

    /// The line of the first of `keys` the file writes; `None` when it writes none.
    pub(super) fn line(&self, keys: &[&str]) -> Option<usize> {
        keys.iter()
            .find_map(|key| self.0.iter().find(|(k, _)| k == key).map(|(_, line)| *line))
    }

    /// An error about `keys[0]`, on the line of the first of `keys` the file
    /// writes: the key itself, else where the rule's other inputs are.
    pub(super) fn error(&self, keys: &[&str], message: String) -> ConfigError {
        error(keys[0], self.line(keys), message)
    }
}
