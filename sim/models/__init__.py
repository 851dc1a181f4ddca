"""What a step costs and what fits: model arithmetic, memory, roofline, step-time models, speculative maths, number formats."""
