"""ReCycle side by side with its peers (torchft), on the same model, data and kills."""
