//! The statements the Postgres store sends, for one table name.
//!
//! Times are microseconds since the Unix epoch (`bigint`), the unit of the algorithms, read
//! from `clock_timestamp()`: the time when the statement reads it, not `now()`, which is the
//! start of the transaction and, for a step that waited for a row's lock, earlier than the time
//! the previous holder decided at.

/// The statements for one table.
#[derive(Debug)]
pub(super) struct Statements {
    pub(super) schema: String,
    pub(super) read: String,
    pub(super) lock: String,
    pub(super) clock: &'static str,
    pub(super) write: String,
    pub(super) remove_idle: String,
    pub(super) list: String,
}

const NOW: &str = "(extract(epoch FROM clock_timestamp()) * 1000000)::bigint";

impl Statements {
    pub(super) fn new(table: &str) -> Statements {
        Statements {
            schema: schema(table),
            read: format!(
                "SELECT k.i, s.version, s.state, s.expires_at, {NOW} \
                 FROM unnest($1::smallint[], $2::text[], $3::bytea[]) WITH ORDINALITY \
                   AS k(kind, rule, key, i) \
                 LEFT JOIN {table} s ON s.kind = k.kind AND s.rule = k.rule AND s.key = k.key"
            ),
            // Rows are locked in one order, so two steps never wait for each other in a circle.
            lock: format!(
                "SELECT s.kind, s.rule, s.key, s.version, s.state, s.expires_at FROM {table} s \
                 WHERE (s.kind, s.rule, s.key) IN \
                   (SELECT * FROM unnest($1::smallint[], $2::text[], $3::bytea[])) \
                 ORDER BY s.kind, s.rule, s.key FOR UPDATE"
            ),
            clock: "SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::bigint",
            // One statement, so one round trip and atomic without a transaction: every row is
            // written only if its version is the one read (a new row only if there is still
            // none), and a count short of the rows asked divides by zero, which undoes the
            // whole statement and tells the store of the conflict (SQLSTATE 22012).
            write: format!(
                "WITH w AS ( \
                   SELECT * FROM unnest($1::smallint[], $2::text[], $3::bytea[], $4::bigint[], \
                     $5::bigint[], $6::bytea[], $7::bigint[]) \
                     AS w(kind, rule, key, version, next, state, expires_at) \
                 ), updated AS ( \
                   UPDATE {table} s SET version = w.next, state = w.state, expires_at = w.expires_at \
                   FROM w WHERE w.version <> 0 AND w.state IS NOT NULL \
                     AND s.kind = w.kind AND s.rule = w.rule AND s.key = w.key \
                     AND s.version = w.version \
                   RETURNING 1 \
                 ), deleted AS ( \
                   DELETE FROM {table} s USING w WHERE w.version <> 0 AND w.state IS NULL \
                     AND s.kind = w.kind AND s.rule = w.rule AND s.key = w.key \
                     AND s.version = w.version \
                   RETURNING 1 \
                 ), inserted AS ( \
                   INSERT INTO {table} (kind, rule, key, version, state, expires_at) \
                   SELECT kind, rule, key, next, state, expires_at FROM w \
                   WHERE version = 0 AND state IS NOT NULL \
                   ON CONFLICT DO NOTHING RETURNING 1 \
                 ) \
                 SELECT 1 / (((SELECT count(*) FROM updated) + (SELECT count(*) FROM deleted) \
                   + (SELECT count(*) FROM inserted)) \
                   = (SELECT count(*) FROM w WHERE version <> 0 OR state IS NOT NULL))::int"
            ),
            // Through the expiry's index, oldest first, skipping rows a step holds.
            remove_idle: format!(
                "DELETE FROM {table} WHERE ctid = ANY(ARRAY( \
                   SELECT ctid FROM {table} WHERE expires_at < $1 \
                   ORDER BY expires_at LIMIT $2 FOR UPDATE SKIP LOCKED))"
            ),
            list: format!(
                "SELECT key, version, state, expires_at FROM {table} \
                 WHERE kind = $1 AND rule = $2 AND ($3::bytea IS NULL OR key > $3) \
                 ORDER BY key LIMIT $4"
            ),
        }
    }
}

/// The table and its index (`CREATE … IF NOT EXISTS`: running it again changes nothing).
pub(super) fn schema(table: &str) -> String {
    let name = table.rsplit('.').next().unwrap_or(table);
    // A fill factor leaves room in each page, so that an update that changes no indexed column
    // (the expiry is kept to the second, so most updates of a busy key) stays in its page.
    format!(
        "CREATE TABLE IF NOT EXISTS {table} (\n\
         \x20   kind smallint NOT NULL,\n\
         \x20   rule text NOT NULL,\n\
         \x20   key bytea NOT NULL,\n\
         \x20   version bigint NOT NULL,\n\
         \x20   state bytea NOT NULL,\n\
         \x20   expires_at bigint NOT NULL,\n\
         \x20   PRIMARY KEY (kind, rule, key)\n\
         ) WITH (fillfactor = 70);\n\
         CREATE INDEX IF NOT EXISTS {name}_expires_at ON {table} (expires_at);\n"
    )
}

/// Whether `table` is a plain name, or a schema and a name: lower-case letters, digits and
/// underscores, not starting with a digit (so it needs no quoting and cannot inject SQL).
pub(super) fn valid_table(table: &str) -> bool {
    let part = |p: &str| {
        !p.is_empty()
            && p.len() <= 63
            && !p.starts_with(|c: char| c.is_ascii_digit())
            && p.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
    };
    let parts: Vec<&str> = table.split('.').collect();
    parts.len() <= 2 && parts.iter().all(|p| part(p))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_names() {
        for good in ["tollgate_state", "limits.state", "t1"] {
            assert!(valid_table(good), "{good}");
        }
        for bad in ["", "1t", "a.b.c", "Tollgate", "x; drop table y", "a-b"] {
            assert!(!valid_table(bad), "{bad}");
        }
        assert!(schema("limits.state").contains("INDEX IF NOT EXISTS state_expires_at"));
    }
}
