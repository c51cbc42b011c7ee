//! Generates the oracle's `Config`, `Hparams` and switch enums from
//! `python/grpo_kernels/schema.json`, the one place where docs/spec.md's
//! switches and hyperparameters are named (src/config.rs includes the output).

use std::fmt::Write as _;
use std::path::Path;

use serde_json::Value;

const SCHEMA: &str = "../python/grpo_kernels/schema.json";

struct Switch {
    name: String,
    since: u64,
    doc: String,
    /// (value, since, weight, doc); a bool switch's values are "false" / "true".
    values: Vec<(String, u64, u64, String)>,
    is_bool: bool,
}

struct Hparam {
    name: String,
    since: u64,
    default: String,
    infinite: Option<String>,
    draw: Vec<String>,
    doc: String,
}

fn fail(message: String) -> ! {
    panic!("{SCHEMA}: {message}")
}

fn text(v: &Value, key: &str) -> String {
    v.get(key).and_then(Value::as_str).unwrap_or("").to_string()
}

/// A hyperparameter value as Rust source: a number, or "inf" / "-inf".
fn number(v: &Value, what: &str) -> String {
    match v {
        Value::Number(n) => {
            let x = n.as_f64().unwrap_or_else(|| fail(format!("{what}: {n} is not a number")));
            // Every hyperparameter is an f32 value (docs/spec.md).
            format!("({x:?}f32 as f64)")
        }
        Value::String(s) if s == "inf" => "f64::INFINITY".into(),
        Value::String(s) if s == "-inf" => "f64::NEG_INFINITY".into(),
        _ => fail(format!("{what}: {v} is not a number, \"inf\" or \"-inf\"")),
    }
}

fn camel(snake: &str) -> String {
    snake
        .split('_')
        .map(|part| {
            let mut c = part.chars();
            c.next().map(|f| f.to_ascii_uppercase().to_string() + c.as_str()).unwrap_or_default()
        })
        .collect()
}

fn parse(schema: &Value) -> (Vec<Switch>, Vec<Hparam>) {
    let list = |key: &str| schema[key].as_array().cloned().unwrap_or_else(|| fail(format!("no \"{key}\" list")));
    let switches = list("switches")
        .iter()
        .map(|s| {
            let name = text(s, "name");
            let since = s["since"].as_u64().unwrap_or_else(|| fail(format!("switch {name}: no since")));
            let values: Vec<_> = s["values"]
                .as_array()
                .unwrap_or_else(|| fail(format!("switch {name}: no values")))
                .iter()
                .map(|v| {
                    let value = match &v["name"] {
                        Value::String(s) => s.clone(),
                        Value::Bool(b) => b.to_string(),
                        other => fail(format!("switch {name}: value {other} is neither a string nor a bool")),
                    };
                    (value, v["since"].as_u64().unwrap_or(since), v["weight"].as_u64().unwrap_or(1), text(v, "doc"))
                })
                .collect();
            let is_bool = values.iter().any(|(v, ..)| v == "false" || v == "true");
            if is_bool && (values.len() != 2 || values[0].0 != "false") {
                fail(format!("switch {name}: a bool switch's values are false (its default), then true"));
            }
            Switch { doc: text(s, "doc"), name, since, values, is_bool }
        })
        .collect();
    let hparams = list("hparams")
        .iter()
        .map(|h| {
            let name = text(h, "name");
            let what = format!("hyperparameter {name}");
            let draw = h.get("draw").and_then(Value::as_array).map(|d| d.iter().map(|v| number(v, &what)).collect());
            Hparam {
                since: h["since"].as_u64().unwrap_or_else(|| fail(format!("{what}: no since"))),
                default: number(&h["default"], &what),
                infinite: h.get("infinite").map(|v| number(v, &what)),
                draw: draw.unwrap_or_default(),
                doc: text(h, "doc"),
                name,
            }
        })
        .collect();
    (switches, hparams)
}

fn generate(switches: &[Switch], hparams: &[Hparam]) -> String {
    let mut o = String::new();
    let serde = |o: &mut String, attr: &str| writeln!(o, "#[cfg_attr(feature = \"serde\", serde({attr}))]").unwrap();
    // The enums of the switches that are not bools.
    for s in switches.iter().filter(|s| !s.is_bool) {
        let ty = camel(&s.name);
        writeln!(o, "/// {}", s.doc).unwrap();
        writeln!(o, "#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]").unwrap();
        writeln!(o, "#[cfg_attr(feature = \"serde\", derive(serde::Serialize, serde::Deserialize))]").unwrap();
        writeln!(o, "pub enum {ty} {{").unwrap();
        for (i, (value, _, _, doc)) in s.values.iter().enumerate() {
            // The schema's description of the value; where it has none, the
            // switch's, naming the value (docs/spec.md gives its formula).
            if doc.is_empty() {
                writeln!(o, "    /// `{} = \"{value}\"` in docs/spec.md. {}", s.name, s.doc).unwrap();
            } else {
                writeln!(o, "    /// {doc}").unwrap();
            }
            if i == 0 {
                writeln!(o, "    #[default]").unwrap();
            }
            writeln!(o, "    #[cfg_attr(feature = \"serde\", serde(rename = \"{value}\"))]").unwrap();
            writeln!(o, "    {},", camel(value)).unwrap();
        }
        writeln!(o, "}}\n").unwrap();
        writeln!(o, "impl {ty} {{").unwrap();
        writeln!(o, "    /// Every value, in the schema's order (the default first).").unwrap();
        let all: Vec<String> = s.values.iter().map(|(v, ..)| format!("{ty}::{}", camel(v))).collect();
        writeln!(o, "    pub const ALL: [{ty}; {}] = [{}];", all.len(), all.join(", ")).unwrap();
        writeln!(o, "    /// Its name in docs/spec.md and on the wire.").unwrap();
        writeln!(o, "    pub fn name(self) -> &'static str {{\n        match self {{").unwrap();
        for (v, ..) in &s.values {
            writeln!(o, "            {ty}::{} => \"{v}\",", camel(v)).unwrap();
        }
        writeln!(o, "        }}\n    }}\n}}\n").unwrap();
    }

    // The switch table.
    writeln!(o, "/// Every switch of docs/spec.md, in the schema's order.").unwrap();
    writeln!(o, "pub static SWITCHES: [SwitchInfo; {}] = [", switches.len()).unwrap();
    for s in switches {
        let values: Vec<String> = s
            .values
            .iter()
            .map(|(v, since, weight, _)| format!("ValueInfo {{ name: \"{v}\", since: {since}, weight: {weight} }}"))
            .collect();
        writeln!(
            o,
            "    SwitchInfo {{ name: \"{}\", since: {}, is_bool: {}, values: &[{}] }},",
            s.name,
            s.since,
            s.is_bool,
            values.join(", ")
        )
        .unwrap();
    }
    writeln!(o, "];\n").unwrap();

    // Config.
    writeln!(o, "/// The static switches of docs/spec.md. Those of SPEC v2 default to v1's behaviour").unwrap();
    writeln!(o, "/// (and a repro written before v2 reads with them off).").unwrap();
    writeln!(o, "#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]").unwrap();
    writeln!(o, "#[cfg_attr(feature = \"serde\", derive(serde::Serialize, serde::Deserialize))]").unwrap();
    writeln!(o, "pub struct Config {{").unwrap();
    for s in switches {
        writeln!(o, "    /// {}", s.doc).unwrap();
        if s.since > 1 {
            serde(&mut o, "default");
        }
        let ty = if s.is_bool { "bool".to_string() } else { camel(&s.name) };
        writeln!(o, "    pub {}: {ty},", s.name).unwrap();
    }
    writeln!(o, "}}\n").unwrap();
    writeln!(o, "impl Default for Config {{\n    /// Every switch at its first value: v1's behaviour, every term off.").unwrap();
    writeln!(o, "    fn default() -> Self {{\n        Config {{").unwrap();
    for s in switches {
        let value = if s.is_bool { "false".to_string() } else { format!("{}::{}", camel(&s.name), camel(&s.values[0].0)) };
        writeln!(o, "            {}: {value},", s.name).unwrap();
    }
    writeln!(o, "        }}\n    }}\n}}\n").unwrap();
    writeln!(o, "impl Config {{").unwrap();
    writeln!(o, "    /// Each switch's value, by name, in [`SWITCHES`]' order.").unwrap();
    writeln!(o, "    pub fn switch_values(&self) -> [&'static str; {}] {{\n        [", switches.len()).unwrap();
    for s in switches {
        if s.is_bool {
            writeln!(o, "            if self.{} {{ \"true\" }} else {{ \"false\" }},", s.name).unwrap();
        } else {
            writeln!(o, "            self.{}.name(),", s.name).unwrap();
        }
    }
    writeln!(o, "        ]\n    }}\n").unwrap();
    writeln!(o, "    /// Sets switch `name` to the value named `value`; false when either is unknown.").unwrap();
    writeln!(o, "    pub fn set_switch(&mut self, name: &str, value: &str) -> bool {{\n        match name {{").unwrap();
    for s in switches {
        if s.is_bool {
            writeln!(
                o,
                "            \"{n}\" => match value {{ \"true\" => self.{n} = true, \"false\" => self.{n} = false, _ => return false }},",
                n = s.name
            )
            .unwrap();
        } else {
            let ty = camel(&s.name);
            writeln!(
                o,
                "            \"{n}\" => match {ty}::ALL.into_iter().find(|v| v.name() == value) {{ Some(v) => self.{n} = v, None => return false }},",
                n = s.name
            )
            .unwrap();
        }
    }
    writeln!(o, "            _ => return false,\n        }}\n        true\n    }}\n}}\n").unwrap();

    // The hyperparameter table.
    writeln!(o, "/// Every hyperparameter of docs/spec.md, in the schema's order.").unwrap();
    writeln!(o, "pub static HPARAMS: [HparamInfo; {}] = [", hparams.len()).unwrap();
    for h in hparams {
        let infinite = h.infinite.as_deref().map(|v| format!("Some({v})")).unwrap_or("None".into());
        writeln!(
            o,
            "    HparamInfo {{ name: \"{}\", since: {}, default: {}, infinite: {infinite}, draw: &[{}] }},",
            h.name,
            h.since,
            h.default,
            h.draw.join(", ")
        )
        .unwrap();
    }
    writeln!(o, "];\n").unwrap();

    // Hparams.
    writeln!(o, "/// Runtime hyperparameters, as the f32 values an implementation receives.").unwrap();
    writeln!(o, "/// In JSON an infinity is the string \"inf\" or \"-inf\" (null, written before, reads as the field's own).").unwrap();
    writeln!(o, "#[derive(Clone, Copy, Debug, PartialEq)]").unwrap();
    writeln!(o, "#[cfg_attr(feature = \"serde\", derive(serde::Serialize, serde::Deserialize))]").unwrap();
    writeln!(o, "pub struct Hparams {{").unwrap();
    for (i, h) in hparams.iter().enumerate() {
        writeln!(o, "    /// {}", h.doc).unwrap();
        let mut attr = format!("serialize_with = \"json_number::serialize\", deserialize_with = \"json_number::deserialize::<_, {i}>\"");
        if h.since > 1 {
            attr = format!("default = \"default_hparam::<{i}>\", {attr}");
        }
        serde(&mut o, &attr);
        writeln!(o, "    pub {}: f64,", h.name).unwrap();
    }
    writeln!(o, "}}\n").unwrap();
    writeln!(o, "impl Default for Hparams {{\n    /// Every hyperparameter at its schema default: v1's neutral values and v2's defaults.").unwrap();
    writeln!(o, "    fn default() -> Self {{\n        Hparams {{").unwrap();
    for h in hparams {
        writeln!(o, "            {}: {},", h.name, h.default).unwrap();
    }
    writeln!(o, "        }}\n    }}\n}}\n").unwrap();
    writeln!(o, "impl Hparams {{").unwrap();
    writeln!(o, "    /// Each hyperparameter's value, in [`HPARAMS`]' order.").unwrap();
    writeln!(o, "    pub fn values(&self) -> [f64; {}] {{\n        [", hparams.len()).unwrap();
    for h in hparams {
        writeln!(o, "            self.{},", h.name).unwrap();
    }
    writeln!(o, "        ]\n    }}\n").unwrap();
    writeln!(o, "    /// The hyperparameter named `name`, to read or set; None when unknown.").unwrap();
    writeln!(o, "    pub fn field_mut(&mut self, name: &str) -> Option<&mut f64> {{\n        match name {{").unwrap();
    for h in hparams {
        writeln!(o, "            \"{n}\" => Some(&mut self.{n}),", n = h.name).unwrap();
    }
    writeln!(o, "            _ => None,\n        }}\n    }}\n}}").unwrap();
    o
}

fn main() {
    println!("cargo:rerun-if-changed={SCHEMA}");
    println!("cargo:rerun-if-changed=build.rs");
    let text = std::fs::read_to_string(SCHEMA).unwrap_or_else(|e| fail(format!("cannot read it: {e}")));
    let schema: Value = serde_json::from_str(&text).unwrap_or_else(|e| fail(format!("not JSON: {e}")));
    let (switches, hparams) = parse(&schema);
    let out = Path::new(&std::env::var("OUT_DIR").unwrap()).join("schema.rs");
    std::fs::write(out, generate(&switches, &hparams)).unwrap();
}
