//! `sim-precompile <model.wasm> <models dir> <id>`: compiles a model ahead of time for the
//! module image's worker, checked against the model ABI (see `sim_worker::precompile`).

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [wasm, out_dir, id] = args.as_slice() else {
        eprintln!("usage: sim-precompile <model.wasm> <models dir> <id>");
        std::process::exit(2);
    };
    match sim_worker::precompile::precompile(wasm.as_ref(), out_dir.as_ref(), id) {
        Ok(model) => println!(
            "{} params={} outputs={}",
            model.id, model.params, model.outputs
        ),
        Err(e) => {
            eprintln!("sim-precompile: {e}");
            std::process::exit(1);
        }
    }
}
