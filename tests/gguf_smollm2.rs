//! The embedded SmolLM2-135M-Instruct, from its Q4_1 GGUF, against
//! transformers' own GGUF loading (`gguf_file=`): token ids of our rebuilt
//! tokenizer, the chat template, and logits in fp32 and bf16. Also: a GGUF
//! with an unknown tensor type is refused with the tensor's name.

use falcon_rl::model::decoder::LogitsFor;
use falcon_rl::model::gguf::{convert_to_hf, OutDtype};
use falcon_rl::model::hub;
use falcon_rl::model::weights::read_all;
use falcon_rl::model::{ChatMessage, Dtype, Policy};
use tch::{Device, Tensor};

use crate::common::*;

const CODE: &str = "def fib(n: int) -> int:\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n    if n < 2:\n        return n\n\ta, b = 0, 1\n    for _ in range(n - 1):\n        a, b = b, a + b  # 12345 + 67890\n    return b\n\n\nclass Café:\n    π = 3.14159\n    s = \"🚀 naïve — 日本語\"\r\n    d = {'k': [1,2,3]}[::-1]   \n<|im_start|>user\nhi<|im_end|><|endoftext|>";

const PROMPTS: [&str; 3] = [
    "def quicksort(arr):",
    "<|im_start|>user\nWrite a function that reverses a string.<|im_end|>\n<|im_start|>assistant\n",
    "The capital of France is",
];

#[test]
fn smollm2_gguf_tokens_chat_template_and_logits_match_transformers() {
    let gguf = hub::embedded_gguf().expect("scripts/setup installs the embedded GGUF");
    let dir = hub::resolve(hub::EMBEDDED).unwrap();
    let work = tmpdir();
    let mut texts = vec![CODE.to_string()];
    texts.extend(PROMPTS.iter().map(|s| s.to_string()));
    let texts_path = work.path().join("texts.json");
    std::fs::write(&texts_path, serde_json::to_string(&texts).unwrap()).unwrap();
    run_python(
        "fixtures/gguf-reference.py",
        &[
            gguf.to_str().unwrap(),
            texts_path.to_str().unwrap(),
            work.path().to_str().unwrap(),
        ],
    );
    let reference: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(work.path().join("ids.json")).unwrap())
            .unwrap();
    let ref_ids = ids_from_json(&reference["ids"]);
    let ref_logits = read_all(&work.path().join("logits.safetensors")).unwrap();

    let p32 = Policy::load(&dir, Dtype::Fp32, Device::Cpu).unwrap();
    let tok = p32.tokenizer().unwrap();
    for (i, text) in texts.iter().enumerate() {
        let ours = tok.encode(text, false).unwrap();
        assert_eq!(ours, ref_ids[i], "token ids of text {i}");
        assert_eq!(
            &tok.decode(&ours, false).unwrap(),
            text,
            "decode round trip of text {i}"
        );
    }
    assert!(ref_ids[0].len() > 60, "the code sample is a real test");
    let chat = tok
        .apply_chat_template(
            &[
                ChatMessage::new("system", "You write Python."),
                ChatMessage::new("user", "Reverse a string.\n  Keep it short."),
            ],
            true,
        )
        .unwrap();
    assert_eq!(chat, reference["chat"].as_str().unwrap(), "chat template");

    let p16 = Policy::load(&dir, Dtype::Bf16, Device::Cpu).unwrap();
    for i in 1..texts.len() {
        let ids = Tensor::from_slice(&ref_ids[i]).view([1, -1]);
        for (p, tag, tol) in [(&p32, "fp32", 1e-3), (&p16, "bf16", 0.0)] {
            let ours = tch::no_grad(|| {
                p.model
                    .forward(&ids, None, None, LogitsFor::All, false)
                    .unwrap()
            })
            .squeeze_dim(0);
            let want = &ref_logits[&format!("{tag}.{i}")];
            let d = max_abs_diff(&ours, want);
            // bf16: within twice transformers' own bf16-vs-fp32 error on this text.
            let tol = if tol > 0.0 {
                tol
            } else {
                2.0 * max_abs_diff(want, &ref_logits[&format!("fp32.{i}")])
            };
            eprintln!("prompt {i} {tag}: max |Δlogit| = {d:.3e} (tolerance {tol:.3e})");
            assert!(d <= tol, "prompt {i} {tag}: {d} > {tol}");
            assert_eq!(
                ours.argmax(-1, false),
                want.argmax(-1, false).to_kind(tch::Kind::Int64),
                "prompt {i} {tag}: top-1 tokens"
            );
        }
    }
}

/// A minimal GGUF v3 file: no metadata, one tensor of the given type id.
fn gguf_with_tensor_type(type_id: u32) -> Vec<u8> {
    let mut b = Vec::new();
    b.extend_from_slice(b"GGUF");
    b.extend_from_slice(&3u32.to_le_bytes());
    b.extend_from_slice(&1u64.to_le_bytes()); // tensors
    b.extend_from_slice(&0u64.to_le_bytes()); // metadata kvs
    let name = b"blk.0.attn_q.weight";
    b.extend_from_slice(&(name.len() as u64).to_le_bytes());
    b.extend_from_slice(name);
    b.extend_from_slice(&1u32.to_le_bytes()); // n_dims
    b.extend_from_slice(&32u64.to_le_bytes());
    b.extend_from_slice(&type_id.to_le_bytes());
    b.extend_from_slice(&0u64.to_le_bytes()); // offset
    while b.len() % 32 != 0 {
        b.push(0);
    }
    b.extend_from_slice(&[0u8; 256]);
    b
}

#[test]
fn gguf_with_unknown_tensor_type_names_file_and_tensor() {
    let d = tmpdir();
    let f = d.path().join("weird.gguf");
    std::fs::write(&f, gguf_with_tensor_type(250)).unwrap();
    let e = convert_to_hf(&f, &d.path().join("out"), OutDtype::F32)
        .unwrap_err()
        .to_string();
    assert!(e.contains("weird.gguf"), "{e}");
    assert!(e.contains("blk.0.attn_q.weight"), "{e}");
    assert!(e.contains("250"), "{e}");
    // A truncated header is an error too, not a panic.
    std::fs::write(&f, &gguf_with_tensor_type(0)[..20]).unwrap();
    let e = convert_to_hf(&f, &d.path().join("out"), OutDtype::F32)
        .unwrap_err()
        .to_string();
    assert!(e.contains("weird.gguf"), "{e}");
}

/// Generation that watches only for the answer's code block to close
/// decodes the text again only after a token that may hold a backtick.
/// Replayed token by token with the real tokenizer, the first prefix that
/// closes the block always ends in such a token, and most tokens are not
/// flagged (the shortcut skips work).
#[test]
fn a_code_block_closes_only_on_a_token_that_may_hold_a_backtick() {
    let dir = hub::resolve(hub::EMBEDDED).unwrap();
    let p = Policy::load(&dir, Dtype::Fp32, Device::Cpu).unwrap();
    let tok = p.tokenizer().unwrap();
    let params = falcon_rl::model::GenerationParams {
        stop_at_block_end: true,
        ..Default::default()
    };
    for text in [
        "Sure:\n```python\ndef f(x):\n    return x\n```\nDone.",
        "```\nx = 1\n``` and more",
        "```py\n\n```python\ny = [2]\n    ````",
        "Here `f` is:\n```python\nz=`3`\n```",
    ] {
        let ids = tok.encode(text, false).unwrap();
        let closes = |n: usize| {
            let t = tok.decode(&ids[..n], true).unwrap();
            falcon_rl::model::generate::stop_in(&t, &params).is_some()
        };
        let n = (1..=ids.len())
            .find(|&n| closes(n))
            .expect("the block closes");
        assert!(tok.may_hold_backtick(ids[n - 1]), "{text:?}: token {n}");
    }
    let flagged = (0..2000).filter(|&i| tok.may_hold_backtick(i)).count();
    assert!(
        flagged > 0 && flagged < 100,
        "{flagged} of 2000 ids flagged"
    );
    assert!(tok.may_hold_backtick(-1) && tok.may_hold_backtick(1 << 40));
}
