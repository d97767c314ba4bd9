//! The schema of a stream: declared fields by position, the key field and the event-time field.

use std::fmt;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FieldType {
    String,
    Int,
    Float,
    Bool,
    /// A canonical standard base64 string (with padding), kept as that string.
    Bytes,
    /// A list of result ids (`_supersedes`); written by braid, never declared.
    IdList,
}

impl FieldType {
    pub fn parse(name: &str) -> Option<FieldType> {
        Some(match name {
            "string" => FieldType::String,
            "int" => FieldType::Int,
            "float" => FieldType::Float,
            "bool" => FieldType::Bool,
            "bytes" => FieldType::Bytes,
            _ => return None,
        })
    }

    /// Whether a field of this type can be a key (CONTRACT.md: string or int).
    pub fn can_be_key(self) -> bool {
        matches!(self, FieldType::String | FieldType::Int)
    }
}

impl fmt::Display for FieldType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            FieldType::String => "string",
            FieldType::Int => "int",
            FieldType::Float => "float",
            FieldType::Bool => "bool",
            FieldType::Bytes => "bytes",
            FieldType::IdList => "id list",
        })
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Field {
    pub name: String,
    pub ty: FieldType,
    /// May hold null: a field of a side an outer join can miss.
    pub nullable: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TimeUnit {
    Ms,
    S,
    Rfc3339,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TimeSpec {
    /// No `time` table: the event time is the arrival (processing time).
    Ingest,
    Field {
        pos: usize,
        unit: TimeUnit,
    },
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Schema {
    pub fields: Vec<Field>,
    /// Positions of the key fields, in the key's order: one field, or several for a composite
    /// key (`key = ["site", "device"]`); empty for a broadcast stream (`key = "*"`).
    pub key: Vec<usize>,
    pub time: TimeSpec,
    /// Field positions in field-name order: a row id hashes the values in this order (rule 10).
    pub id_order: Vec<usize>,
    /// Each field's name as a JSON object member's start, `"name":` (written on every output line).
    pub json_members: Vec<Box<[u8]>>,
}

impl Schema {
    /// `key`: the key field positions (`Some(pos)` for one, `None` for broadcast, a list for a
    /// composite key).
    pub fn new(fields: Vec<Field>, key: impl IntoIterator<Item = usize>, time: TimeSpec) -> Schema {
        let mut id_order: Vec<usize> = (0..fields.len()).collect();
        id_order.sort_by(|&a, &b| fields[a].name.cmp(&fields[b].name));
        let json_members = fields.iter().map(|f| super::json::member_text(&f.name)).collect();
        Schema { fields, key: key.into_iter().collect(), time, id_order, json_members }
    }

    pub fn position(&self, name: &str) -> Option<usize> {
        self.fields.iter().position(|f| f.name == name)
    }

    /// The key fields in the key's order (none for a broadcast stream).
    pub fn key_fields(&self) -> impl ExactSizeIterator<Item = &Field> + Clone {
        self.key.iter().map(|&k| &self.fields[k])
    }

    pub fn is_broadcast(&self) -> bool {
        self.key.is_empty()
    }

    /// The key field names joined by `, ` (`site, device`), for messages.
    pub fn key_names(&self) -> String {
        self.key_fields().map(|f| f.name.as_str()).collect::<Vec<_>>().join(", ")
    }

    /// The schema of the event-time field alone (no field for ingest time), unkeyed: what a line
    /// needs to be read for its arrival ([`arrival_of_line`](super::decode::arrival_of_line)).
    pub fn time_only(&self) -> Schema {
        match self.time {
            TimeSpec::Ingest => Schema::new(Vec::new(), None, TimeSpec::Ingest),
            TimeSpec::Field { pos, unit } => {
                Schema::new(vec![self.fields[pos].clone()], None, TimeSpec::Field { pos: 0, unit })
            }
        }
    }

    /// The key of a row of this schema ([`Key::from_values`](super::Key::from_values)).
    pub fn key_of(&self, values: &[super::Value]) -> Option<super::Key> {
        super::Key::from_values(values, &self.key)
    }
}
