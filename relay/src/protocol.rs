//! The relay's line protocol on stdout (grants.md §8.7 step 1): one word per line, nothing
//! else. plimsolld reads at most [`MAX_LINE`] bytes of an unfinished line and drops longer
//! lines whole, so anything else a line could carry is noise to it.

/// Printed once, when both listeners are up.
pub const READY: &str = "ready";
/// Printed for each guest connection that found no dialled-in connection waiting: plimsolld
/// should dial one more.
pub const NEED: &str = "need";
/// The most bytes plimsolld keeps of a line it has not seen the end of.
pub const MAX_LINE: usize = 64;
/// The relay's exit status when it cannot listen (the port is taken, the socket exists);
/// plimsolld then tries another port.
pub const EXIT_CANNOT_LISTEN: i32 = 3;
/// Its exit status for a bad command line.
pub const EXIT_USAGE: i32 = 2;
