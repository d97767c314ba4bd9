//! Sources: where rows enter braid. [`route`] maps an MQTT topic to the streams whose `topic`
//! filter it matches and the fields their `+name` levels capture.

pub mod route;
