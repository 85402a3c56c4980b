//! CSV with a header row: columns named by the [`FieldMap`].

use std::io::{self, BufRead};

use super::{Entry, FieldMap, Skip, Source};

pub(super) struct Reader<R: io::Read> {
    csv: csv::Reader<R>,
    fields: FieldMap,
    names: Option<Vec<String>>,
    record: csv::StringRecord,
}

impl<R: BufRead> Reader<R> {
    pub(super) fn new(input: R, fields: FieldMap) -> Self {
        Reader {
            csv: csv::ReaderBuilder::new()
                .flexible(true)
                .has_headers(false)
                .from_reader(input),
            fields,
            names: None,
            record: csv::StringRecord::new(),
        }
    }
}

impl<R: BufRead> Source for Reader<R> {
    fn next_entry(&mut self) -> Option<io::Result<Result<Entry, Skip>>> {
        loop {
            match self.csv.read_record(&mut self.record) {
                Ok(false) => return None,
                Ok(true) => {}
                Err(error) => {
                    return match error.into_kind() {
                        csv::ErrorKind::Io(error) => Some(Err(error)),
                        csv::ErrorKind::Utf8 { .. } => Some(Ok(Err(Skip::NotText))),
                        _ => Some(Ok(Err(Skip::BadRecord))),
                    }
                }
            }
            let Some(names) = &self.names else {
                // The first record names the columns.
                self.names = Some(self.record.iter().map(|n| n.trim().to_owned()).collect());
                continue;
            };
            if self.record.len() < names.len() {
                return Some(Ok(Err(Skip::Truncated)));
            }
            let record = &self.record;
            return Some(Ok(self.fields.entry(|name| {
                let at = names.iter().position(|n| n == name)?;
                record.get(at)
            })));
        }
    }
}
