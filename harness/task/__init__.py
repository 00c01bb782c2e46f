"""The task, the only AIME-shaped code: problems.py (problem sets and their rows), prompts.py (the templates),
answers.py (extract and score an answer: sympy-normalised, pure functions), chat.py (an instruct model's chat
template around the prompt: model.chat=model)."""
