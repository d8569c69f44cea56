//! The service's error vocabulary: Connect's codes, shared by both APIs. The Connect API
//! writes them snake_case (`resource_exhausted`); the REST API camelCase
//! (`resourceExhausted`), with an HTTP status each operation documents.

use serde_json::{Value, json};

/// Connect's error codes (connectrpc.com/docs/protocol#error-codes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Code {
    Canceled,
    Unknown,
    InvalidArgument,
    DeadlineExceeded,
    NotFound,
    AlreadyExists,
    PermissionDenied,
    ResourceExhausted,
    FailedPrecondition,
    Aborted,
    OutOfRange,
    Unimplemented,
    Internal,
    Unavailable,
    DataLoss,
    Unauthenticated,
}

impl Code {
    /// The Connect name, e.g. `resource_exhausted`.
    pub fn connect_name(self) -> &'static str {
        match self {
            Code::Canceled => "canceled",
            Code::Unknown => "unknown",
            Code::InvalidArgument => "invalid_argument",
            Code::DeadlineExceeded => "deadline_exceeded",
            Code::NotFound => "not_found",
            Code::AlreadyExists => "already_exists",
            Code::PermissionDenied => "permission_denied",
            Code::ResourceExhausted => "resource_exhausted",
            Code::FailedPrecondition => "failed_precondition",
            Code::Aborted => "aborted",
            Code::OutOfRange => "out_of_range",
            Code::Unimplemented => "unimplemented",
            Code::Internal => "internal",
            Code::Unavailable => "unavailable",
            Code::DataLoss => "data_loss",
            Code::Unauthenticated => "unauthenticated",
        }
    }

    /// The REST API's name, e.g. `resourceExhausted`.
    pub fn rest_name(self) -> String {
        let mut out = String::new();
        let mut upper = false;
        for c in self.connect_name().chars() {
            if c == '_' {
                upper = true;
            } else if upper {
                out.push(c.to_ascii_uppercase());
                upper = false;
            } else {
                out.push(c);
            }
        }
        out
    }

    /// The gRPC number, as a google.rpc.Status in an Operation carries it.
    pub fn number(self) -> i32 {
        match self {
            Code::Canceled => 1,
            Code::Unknown => 2,
            Code::InvalidArgument => 3,
            Code::DeadlineExceeded => 4,
            Code::NotFound => 5,
            Code::AlreadyExists => 6,
            Code::PermissionDenied => 7,
            Code::ResourceExhausted => 8,
            Code::FailedPrecondition => 9,
            Code::Aborted => 10,
            Code::OutOfRange => 11,
            Code::Unimplemented => 12,
            Code::Internal => 13,
            Code::Unavailable => 14,
            Code::DataLoss => 15,
            Code::Unauthenticated => 16,
        }
    }

    /// The HTTP status of a unary Connect error with this code.
    pub fn http_status(self) -> u16 {
        match self {
            Code::Canceled => 499,
            Code::Unknown | Code::Internal | Code::DataLoss => 500,
            Code::InvalidArgument | Code::FailedPrecondition | Code::OutOfRange => 400,
            Code::DeadlineExceeded => 504,
            Code::NotFound => 404,
            Code::AlreadyExists | Code::Aborted => 409,
            Code::PermissionDenied => 403,
            Code::ResourceExhausted => 429,
            Code::Unimplemented => 501,
            Code::Unavailable => 503,
            Code::Unauthenticated => 401,
        }
    }
}

/// One refusal: a code, a message, optionally the HTTP status a REST operation
/// documents for it and structured details.
#[derive(Debug, Clone)]
pub struct ApiError {
    pub code: Code,
    pub message: String,
    pub http: Option<u16>,
    pub details: Vec<Value>,
}

impl ApiError {
    pub fn new(code: Code, message: impl Into<String>) -> ApiError {
        ApiError {
            code,
            message: message.into(),
            http: None,
            details: Vec::new(),
        }
    }

    pub fn with_http(mut self, status: u16) -> ApiError {
        self.http = Some(status);
        self
    }

    pub fn with_detail(mut self, detail: Value) -> ApiError {
        self.details.push(detail);
        self
    }

    pub fn invalid(message: impl Into<String>) -> ApiError {
        ApiError::new(Code::InvalidArgument, message)
    }

    pub fn not_found(message: impl Into<String>) -> ApiError {
        ApiError::new(Code::NotFound, message)
    }

    pub fn unauthenticated(message: impl Into<String>) -> ApiError {
        ApiError::new(Code::Unauthenticated, message)
    }

    pub fn internal(message: impl Into<String>) -> ApiError {
        ApiError::new(Code::Internal, message)
    }

    /// The quota refusal, in the words the live service used.
    pub fn quota() -> ApiError {
        ApiError::new(
            Code::ResourceExhausted,
            "Maximum running sandboxes quota reached",
        )
    }

    /// The Connect error body.
    pub fn connect_json(&self) -> Value {
        let mut body = json!({ "code": self.code.connect_name(), "message": self.message });
        if !self.details.is_empty() {
            body["details"] = Value::Array(self.details.clone());
        }
        body
    }

    /// The REST error body (`Error` in the API reference).
    pub fn rest_json(&self) -> Value {
        json!({ "code": self.code.rest_name(), "message": self.message, "details": self.details })
    }

    /// The REST status: the documented one, else the Connect mapping.
    pub fn rest_status(&self) -> u16 {
        self.http.unwrap_or_else(|| self.code.http_status())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rest_names_are_camel_case() {
        assert_eq!(Code::ResourceExhausted.rest_name(), "resourceExhausted");
        assert_eq!(Code::FailedPrecondition.rest_name(), "failedPrecondition");
        assert_eq!(Code::Internal.rest_name(), "internal");
    }
}
