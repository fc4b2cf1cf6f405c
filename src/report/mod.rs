//! Report: telling people what Setpoint did, outside the status.

pub mod events;
