"""Logit distillation (Hinton et al., 2015): the student learns the teacher's whole next-token distribution on the
answer tokens, not only the dataset's one token. Only when both read text with the same tokenizer (the service
checks), since the distributions are over token ids. The loss blends the KL divergence at a temperature with the
ordinary cross-entropy on the dataset's answers:

    loss = alpha · T² · KL(teacher_T ‖ student_T) + (1 − alpha) · CE

Sequence-level distillation needs nothing here: the worker has the teacher deployment answer the dataset's prompts
through the gateway (enhancement/runner.py), and the student is fine-tuned on those answers as on any dataset.
"""

from enhancement.training.data import IGNORE_INDEX


def distilling_trainer(trainer_class, teacher, *, temperature: float, alpha: float):
    import torch
    import torch.nn.functional as F

    teacher.eval()
    teacher.requires_grad_(False)

    class Distilling(trainer_class):
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            outputs = model(**inputs)
            answer = inputs["labels"][:, 1:] != IGNORE_INDEX
            device = inputs["input_ids"].device
            if next(teacher.parameters()).device != device:
                teacher.to(device)
            with torch.no_grad():
                # Packed rows (batches.py) carry positions instead of a mask: the teacher reads them as the student.
                taught = teacher(input_ids=inputs["input_ids"], attention_mask=inputs.get("attention_mask"),
                                 position_ids=inputs.get("position_ids"), use_cache=False).logits
            # Embedding tables may be padded to different sizes; the shared tokenizer's ids come first in both.
            width = min(outputs.logits.size(-1), taught.size(-1))
            student = outputs.logits[:, :-1, :width][answer] / temperature
            target = taught[:, :-1, :width][answer].to(student.dtype) / temperature
            divergence = F.kl_div(F.log_softmax(student, dim=-1), F.log_softmax(target, dim=-1), log_target=True,
                                  reduction="batchmean") * temperature ** 2
            loss = alpha * divergence + (1 - alpha) * outputs.loss
            return (loss, outputs) if return_outputs else loss

    return Distilling
