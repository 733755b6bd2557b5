"""Runs llama.cpp's converter on a Hugging Face directory, in its own process (it puts its own gguf-py first on the
path). With --vocab-from, the model's vocabulary and tokenizer settings are copied from that GGUF instead of being
rebuilt from the directory's tokenizer: a tokenizer that transformers read out of a GGUF cannot always be converted
back (Gemma 3's has no sentencepiece model), and copying keeps the tuned model's tokens identical to the base's.

    python -m enhancement.training.gguf_convert --converter DIR --model-dir DIR --out FILE
           [--vocab-from BASE.gguf] [--chat-template-file FILE]
"""

import argparse
import sys
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--converter", required=True)
    parser.add_argument("--model-dir", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--vocab-from", default="")
    parser.add_argument("--chat-template-file", default="")
    args = parser.parse_args()
    converter = Path(args.converter)
    sys.path[:0] = [str(converter), str(converter / "gguf-py")]

    import gguf
    import torch
    from conversion import ModelBase, ModelType, get_model_architecture, get_model_class

    chat_template = Path(args.chat_template_file).read_text(encoding="utf-8") if args.chat_template_file else ""
    model_dir = Path(args.model_dir)
    hparams = ModelBase.load_hparams(model_dir, False)
    base_class = get_model_class(get_model_architecture(hparams, ModelType.TEXT))

    class Converted(base_class):
        model_arch = base_class.model_arch

        def set_vocab(self):
            if not args.vocab_from:
                super().set_vocab()  # the directory's tokenizer config carries the chat template
                return
            reader = gguf.GGUFReader(args.vocab_from)
            for field in reader.fields.values():
                if not field.name.startswith("tokenizer.") or field.name == gguf.Keys.Tokenizer.CHAT_TEMPLATE:
                    continue
                kind = field.types[0]
                sub_type = field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
                self.gguf_writer.add_key_value(field.name, field.contents(), kind, sub_type=sub_type)
            if chat_template:
                self.gguf_writer.add_chat_template(chat_template)

    with torch.inference_mode():
        model = Converted(model_dir, gguf.LlamaFileType.MOSTLY_F16, Path(args.out))
        model.write()


if __name__ == "__main__":
    main()
