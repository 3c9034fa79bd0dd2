pub mod llm;
pub mod textcalls;
