"""The route's learned difficulty score: logistic regression on the request's embedding (from an embedding
deployment), trained on calibration outcomes to tell the prompts where the big model answers better than the small
one. scikit-learn fits it; the gateway needs only its weights, so serving a request is one embedding call and a dot
product, and the stored classifier is plain JSON in the group's settings.

The curve of a classifier is drawn from cross-validated scores (each prompt scored by a model that did not see it),
so that a threshold picked on it is not flattered by the prompts it was trained on.
"""

import math

# The big member must beat the small one by more than this (token-F1 or exact match) for a prompt to count as
# needing it.
MARGIN = 0.05
MAX_FOLDS = 5


class ClassifierUnavailable(ValueError):
    """The outcomes cannot train a classifier (too few, or one class only); the message says why."""


def labels(outcomes: list[dict]) -> list[int]:
    return [int(o["big"]["quality"] > o["small"]["quality"] + MARGIN) for o in outcomes]


def train(outcomes: list[dict], embedding_deployment: str) -> tuple[dict, list[float]]:
    """The classifier trained on every outcome (weights, for the gateway), and each outcome's cross-validated
    score (for the curve)."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import StratifiedKFold, cross_val_predict

    features = [o["embedding"] for o in outcomes]
    target = labels(outcomes)
    minority = min(sum(target), len(target) - sum(target))
    if minority < 2:
        raise ClassifierUnavailable(f"{sum(target)} of {len(target)} prompts needed the big model; a classifier "
                                    f"needs at least two of each kind to learn from.")
    model = LogisticRegression(class_weight="balanced", max_iter=1000)
    folds = StratifiedKFold(n_splits=min(MAX_FOLDS, minority), shuffle=True, random_state=0)
    scores = cross_val_predict(model, features, target, cv=folds, method="predict_proba")[:, 1]
    model.fit(features, target)
    cross_validated = [round(float(s), 4) for s in scores]
    accuracy = sum(int(s >= 0.5) == t for s, t in zip(cross_validated, target)) / len(target)
    return {"embedding_deployment": embedding_deployment, "coef": [float(w) for w in model.coef_[0]],
            "intercept": float(model.intercept_[0]), "needs_big": sum(target), "trained_on": len(target),
            "cv_accuracy": round(accuracy, 4)}, cross_validated


def score(classifier: dict, embedding: list[float]) -> float:
    """P(the big model answers better), from the stored weights."""
    if len(embedding) != len(classifier["coef"]):
        raise ClassifierUnavailable(f"the embedding has {len(embedding)} dimensions, the classifier "
                                    f"{len(classifier['coef'])}")
    logit = classifier["intercept"] + sum(w * x for w, x in zip(classifier["coef"], embedding))
    return 1 / (1 + math.exp(-max(-700.0, min(700.0, logit))))


def check(raw) -> dict:
    """A stored classifier's shape, or ValueError."""
    if not isinstance(raw, dict) or not isinstance(raw.get("embedding_deployment"), str) \
            or not isinstance(raw.get("coef"), list) or not raw["coef"] \
            or not all(isinstance(w, (int, float)) and not isinstance(w, bool) for w in raw["coef"]) \
            or not isinstance(raw.get("intercept"), (int, float)):
        raise ValueError("'classifier' must be {embedding_deployment, coef: [numbers], intercept}, as calibration "
                         "stores it.")
    return raw
