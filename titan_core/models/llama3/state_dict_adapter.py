"""HF <-> native for LlamaForCausalLM (llama3 rope scaling) and MistralForCausalLM (sliding window)."""

from titan_core.models.common.hf_adapter import AdapterError, HFAdapter


class Llama3Adapter(HFAdapter):
    hf_model_types = ("llama", "mistral")

    def hf_names(self, cfg):
        return {**super().hf_names(cfg), "sliding_window": "sliding_window"}

    def width_free(self, cfg):
        # LlamaConfig refuses hidden_size % num_attention_heads != 0 even with a head_dim;
        # Mistral (and a port's own class) reads head_dim as given
        return cfg.get("model_type") != "llama"

    def extra_args_from_hf(self, cfg, take):
        kw = super().extra_args_from_hf(cfg, take)
        # Mistral windows every layer; a Mistral config with layer_types is not consumed here,
        # so it surfaces in unconsumed_keys instead of being treated as all-windowed.
        kw["sliding_window"] = take("sliding_window")
        return kw

    def hf_config(self, args):
        if args.qkv_bias != args.out_bias:
            raise AdapterError("Llama's attention_bias covers q, k, v and o together; args set them differently")
        cfg = super().hf_config(args)
        if args.sliding_window:
            if args.qkv_bias or args.global_every:
                raise AdapterError("Mistral has no attention bias and windows every layer")
            cfg.update(model_type="mistral", architectures=["MistralForCausalLM"], sliding_window=args.sliding_window)
        else:
            cfg["attention_bias"] = args.qkv_bias
        return cfg
