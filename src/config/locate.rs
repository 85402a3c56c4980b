//! Finding the line and column of a place (`rules[2].rate`) in a configuration's text, for the
//! errors found after parsing; and the name of a rule in a text that does not parse as a whole.
//!
//! The text is read a second time with a visitor that follows the place and fails where it
//! ends; the parser then reports that failure at the value's position, exactly as it reports its
//! own errors. So both formats are located by their own parsers, with no position-keeping copy
//! of the document.

use std::fmt;

use serde::de::{self, DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor};

use super::{error, ConfigFormat};

/// The line and column (1-based) of the value at `place`, or of the deepest part of it that the
/// text holds (the rule's table, for a field that is missing from it).
pub(crate) fn locate(format: ConfigFormat, text: &str, place: &str) -> Option<(usize, usize)> {
    let seed = Follow(place);
    match format {
        ConfigFormat::Toml => {
            let deserializer = toml::Deserializer::parse(text).ok()?;
            let error = seed.deserialize(deserializer).err()?;
            let span = error.span()?;
            Some(error::line_column(text, span.start))
        }
        ConfigFormat::Yaml => {
            let deserializer = yaml_serde::Deserializer::from_str(text);
            let at = seed.deserialize(deserializer).err()?.location()?;
            Some((at.line(), at.column()))
        }
    }
}

/// The `name` of the `index`-th rule of `text`, when it is a string: for the errors of a text
/// that does not parse as a whole (an unknown field elsewhere in the rule, say).
pub(crate) fn rule_name(format: ConfigFormat, text: &str, index: usize) -> Option<String> {
    let seed = Skim::File(index);
    match format {
        ConfigFormat::Toml => seed
            .deserialize(toml::Deserializer::parse(text).ok()?)
            .ok()?,
        ConfigFormat::Yaml => seed
            .deserialize(yaml_serde::Deserializer::from_str(text))
            .ok()?,
    }
}

/// Reads one rule's name and skips everything else: the whole file (`File(i)`), the list of
/// rules (`Rules(i)`), the rule (`Rule`), its name (`Name`). A value of another type than
/// expected reads as no name.
#[derive(Clone, Copy)]
enum Skim {
    File(usize),
    Rules(usize),
    Rule,
    Name,
}

impl<'de> DeserializeSeed<'de> for Skim {
    type Value = Option<String>;

    fn deserialize<D: de::Deserializer<'de>>(
        self,
        deserializer: D,
    ) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Skim {
    type Value = Option<String>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any value")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let wanted = match self {
            Skim::File(index) => Some(("rules", Skim::Rules(index))),
            Skim::Rule => Some(("name", Skim::Name)),
            Skim::Rules(_) | Skim::Name => None,
        };
        let mut name = None;
        while let Some(key) = map.next_key::<String>()? {
            match wanted {
                Some((field, inner)) if key == field => name = map.next_value_seed(inner)?,
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(name)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut name = None;
        let mut at = 0;
        loop {
            let more = match self {
                Skim::Rules(index) if at == index => seq
                    .next_element_seed(Skim::Rule)?
                    .map(|found| name = found)
                    .is_some(),
                _ => seq.next_element::<IgnoredAny>()?.is_some(),
            };
            if !more {
                return Ok(name);
            }
            at += 1;
        }
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
        Ok(matches!(self, Skim::Name).then(|| v.to_owned()))
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_u64<E: de::Error>(self, _: u64) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(None)
    }
}

/// Follows the rest of a place (`rules[2].rate`, `.rate`, `[2].rate`, or empty: here).
struct Follow<'p>(&'p str);

/// The error that ends the walk; its position is all that is read.
const FOUND: &str = "here";

impl<'de> DeserializeSeed<'de> for Follow<'_> {
    type Value = ();

    fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Follow<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any value")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let rest = self.0.strip_prefix('.').unwrap_or(self.0);
        if rest.is_empty() {
            return Err(de::Error::custom(FOUND));
        }
        while let Some(key) = map.next_key::<String>()? {
            // Keys may hold dots themselves (plan names, header values): a key matches when
            // the place goes on after it, or ends with it.
            let after = rest
                .strip_prefix(key.as_str())
                .filter(|after| after.is_empty() || after.starts_with(['.', '[']));
            match after {
                Some(after) => return map.next_value_seed(Follow(after)),
                None => map.next_value::<IgnoredAny>()?,
            };
        }
        Err(de::Error::custom(FOUND))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let wanted = self
            .0
            .strip_prefix('[')
            .and_then(|rest| rest.split_once(']'))
            .and_then(|(index, after)| Some((index.parse::<usize>().ok()?, after)));
        let Some((index, after)) = wanted else {
            return Err(de::Error::custom(FOUND));
        };
        for _ in 0..index {
            if seq.next_element::<IgnoredAny>()?.is_none() {
                return Err(de::Error::custom(FOUND));
            }
        }
        match seq.next_element_seed(Follow(after))? {
            Some(()) | None => Err(de::Error::custom(FOUND)),
        }
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<(), E> {
        Err(E::custom(FOUND))
    }

    fn visit_i64<E: de::Error>(self, _: i64) -> Result<(), E> {
        Err(E::custom(FOUND))
    }

    fn visit_u64<E: de::Error>(self, _: u64) -> Result<(), E> {
        Err(E::custom(FOUND))
    }

    fn visit_f64<E: de::Error>(self, _: f64) -> Result<(), E> {
        Err(E::custom(FOUND))
    }

    fn visit_str<E: de::Error>(self, _: &str) -> Result<(), E> {
        Err(E::custom(FOUND))
    }

    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        Err(E::custom(FOUND))
    }

    fn visit_none<E: de::Error>(self) -> Result<(), E> {
        Err(E::custom(FOUND))
    }
}
