//! The gateway's generated client and messages (`proto/openshell/`, never hand-edited), in
//! modules that mirror their packages: the generated code refers to its neighbours as
//! `super::super::sandbox::v1` and the like.
#![allow(clippy::all, missing_docs, unreachable_pub)]

pub mod v1 {
    tonic::include_proto!("openshell.v1");
}

pub mod sandbox {
    pub mod v1 {
        tonic::include_proto!("openshell.sandbox.v1");
    }
}

pub mod datamodel {
    pub mod v1 {
        tonic::include_proto!("openshell.datamodel.v1");
    }
}
