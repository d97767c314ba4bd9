//! The fault backend under the spool and the arena: every fault is an error or a reported skip,
//! never a panic or a silent loss.
