"""One class per P4 control, owning exactly that control's tables (p4src/include/<name>.p4)."""
