"""HF <-> native for LlamaForCausalLM and MistralForCausalLM."""

from titan_core.models.common.hf_adapter import HFAdapter


class Llama3Adapter(HFAdapter):
    hf_model_types = ("llama", "mistral")

    def extra_args_from_hf(self, cfg, take):
        kw = super().extra_args_from_hf(cfg, take)
        kw["sliding_window"] = take("sliding_window")
        return kw

    def hf_config(self, args):
        cfg = super().hf_config(args)
        if args.sliding_window:
            cfg.update(model_type="mistral", architectures=["MistralForCausalLM"], sliding_window=args.sliding_window)
        else:
            cfg["attention_bias"] = args.qkv_bias
        return cfg
