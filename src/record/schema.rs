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
    /// Position of the key field; `None` for a broadcast stream (`key = "*"`).
    pub key: Option<usize>,
    pub time: TimeSpec,
    /// Field positions in field-name order: a row id hashes the values in this order (rule 10).
    pub id_order: Vec<usize>,
}

impl Schema {
    pub fn new(fields: Vec<Field>, key: Option<usize>, time: TimeSpec) -> Schema {
        let mut id_order: Vec<usize> = (0..fields.len()).collect();
        id_order.sort_by(|&a, &b| fields[a].name.cmp(&fields[b].name));
        Schema { fields, key, time, id_order }
    }

    pub fn position(&self, name: &str) -> Option<usize> {
        self.fields.iter().position(|f| f.name == name)
    }

    pub fn key_field(&self) -> Option<&Field> {
        self.key.map(|k| &self.fields[k])
    }
}
